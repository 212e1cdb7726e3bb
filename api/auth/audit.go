package auth

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"

	"carehub/api/envelope"
	"carehub/kernel/access"
	"carehub/kernel/config"
	"carehub/kernel/fault"
	"carehub/kernel/jsonwire"
	"carehub/processors/audit"
	"carehub/storage"
)

// AuditSink takes audit records; *audit.Publisher (carehub/processors/audit) is the real one.
type AuditSink interface {
	// Publish hands rec over without waiting for the broker.
	Publish(rec storage.AuditRecord)
	// PublishSync returns nil only once the broker has acknowledged rec.
	PublishSync(ctx context.Context, rec storage.AuditRecord) error
}

// DefaultAckTimeout bounds how long a response carrying patient data waits for the broker to
// acknowledge its audit record before it is refused with 503.
const DefaultAckTimeout = 5 * time.Second

// maxGraphQLPeek bounds how much of a GraphQL request body the auditor reads to name the
// operation (the body limit is 1 MiB anyway).
const maxGraphQLPeek = 1 << 20

// Auditor writes the HIPAA audit record of every call made with a live key (DECISIONS §2):
// time, organization, key, mode, client IP, user agent, operation, the resources the services
// touched (access.Touch), outcome, HTTP status and latency. Test-key calls are not recorded.
// Refused credentials (401) are, whatever their mode, as failed authentications, sampled per
// client address so that a flood of bad requests cannot become a flood of records (see
// RefusalLimits). Calls refused by the rate limits (429, having reached no handler) are sampled
// per key the same way: a key past its rate would otherwise buy one audit write per refusal.
type Auditor struct {
	sink        AuditSink
	ackTimeout  time.Duration
	graphqlPath string
	now         func() time.Time
	sampler     *sampler // failed authentications, by client address
	limited     *sampler // rate-limited calls, by key
}

// AuditorConfig configures an Auditor. Zero fields take their defaults.
type AuditorConfig struct {
	// AckTimeout is how long a patient-data response waits for its record's acknowledgement.
	// Default DefaultAckTimeout.
	AckTimeout time.Duration
	// GraphQLPath names the GraphQL endpoint, whose calls are recorded by operation rather than
	// by route. Default "/graphql".
	GraphQLPath string
	// RefusalLimits bound how many failed authentications are recorded; unset rates take
	// DefaultRefusalLimits()'s.
	RefusalLimits RefusalLimits
	// Registerer receives the Auditor's metrics (carehub_audit_auth_failures_*) when set.
	Registerer prometheus.Registerer
}

func (c *AuditorConfig) defaults() {
	config.Default(&c.AckTimeout, DefaultAckTimeout)
	config.Default(&c.GraphQLPath, "/graphql")
	c.RefusalLimits = c.RefusalLimits.withDefaults()
}

// NewAuditor returns an Auditor writing to sink.
func NewAuditor(sink AuditSink, cfg AuditorConfig) *Auditor {
	cfg.defaults()
	return &Auditor{sink: sink, ackTimeout: cfg.AckTimeout, graphqlPath: cfg.GraphQLPath, now: time.Now,
		sampler: newRefusalSampler(cfg.RefusalLimits, cfg.Registerer), limited: newLimitedSampler(cfg.RefusalLimits, cfg.Registerer)}
}

// ErrAuditUnavailable is the 503 a patient-data response is replaced with when its audit record
// is not acknowledged in time: patient data never leaves unaudited.
var ErrAuditUnavailable = fault.Unavailable("the audit log is temporarily unavailable; patient data is withheld until it can be recorded")

// Middleware records live-key calls. Place it outside (before) Authenticator.Middleware, so that
// calls the authenticator refuses (IP_NOT_ALLOWED, RATE_LIMITED) are recorded as denied too;
// placed inside, it records the calls that got through.
//
// A live-key response is buffered until the handler returns. If the services touched a patient
// (access.Touch with access.KindPatient), the record is produced synchronously and the response
// is sent only after the broker acknowledges it; when that does not happen within the ack
// timeout, the buffered response is dropped and onError (nil: envelope.WriteError) answers 503
// UNAVAILABLE instead. Other live-key records are produced asynchronously and the response goes
// out at once.
func (a *Auditor) Middleware(onError func(http.ResponseWriter, *http.Request, error)) func(http.Handler) http.Handler {
	if onError == nil {
		onError = envelope.WriteError
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := a.now()
			st := &auditState{a: a}
			ctx, recorder := access.WithRecorder(context.WithValue(r.Context(), auditStateKey{}, st))
			r = r.WithContext(ctx)
			if p := access.From(ctx); p != nil { // placed inside the authenticator
				st.setPrincipal(p)
				r = st.authenticated(r)
			}
			aw := &auditWriter{w: w, st: st, a: a, r: r, recorder: recorder, start: start}
			defer func() {
				if v := recover(); v != nil {
					if aw.aborted { // finish cut a sent response short: nothing more to record
						panic(v)
					}
					// The buffered response is dropped; the recover outside answers 500. The
					// call is still recorded.
					aw.status = http.StatusInternalServerError
					if rec := a.record(aw, r, recorder, start); rec != nil {
						a.sink.Publish(*rec)
					}
					panic(v)
				}
			}()
			next.ServeHTTP(aw, r)
			a.finish(aw, r, recorder, start, onError)
		})
	}
}

func (a *Auditor) finish(aw *auditWriter, r *http.Request, recorder *access.Recorder, start time.Time, onError func(http.ResponseWriter, *http.Request, error)) {
	rec := a.record(aw, r, recorder, start)
	err := aw.err // a part's record was not acknowledged: that part was dropped
	switch {
	case rec == nil:
	case err != nil:
		rec.Status, rec.Outcome = http.StatusServiceUnavailable, "error" // the download was cut
		a.sink.Publish(*rec)
	case len(rec.PatientIDs) == 0 && rec.PatientIDsOmitted == 0:
		a.sink.Publish(*rec)
	case aw.status >= http.StatusInternalServerError:
		// The call failed: its answer is its cause, not patient data, so nothing waits for the
		// record, and the client learns the real cause (a device posting while Kafka is down).
		// A 4xx may name the patients it refused, and waits as any answer with patient data does.
		a.sink.Publish(*rec)
	default:
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), a.ackTimeout)
		err = a.sink.PublishSync(ctx, *rec)
		cancel()
	}
	switch {
	case err == nil:
		aw.send()
	case !aw.sent:
		// onError logs it (a 503), with the cause.
		aw.refuse(r, onError, fault.Wrap(fault.KindUnavailable, err, ErrAuditUnavailable.Message))
	default:
		// Part of a streamed response went out, each part after its record; the rest may not.
		// Cutting the connection tells the client the download is incomplete.
		aw.aborted = true
		panic(http.ErrAbortHandler)
	}
}

// settlePart records the patients a streamed response (one that flushes: an export) touched
// since its last part, and waits for the broker's acknowledgement before the part in the
// buffer is sent: a download of any size goes out part by part, each with its record durable
// first, instead of being held whole until the call's record. A part record is the call's record
// so far, its id the request id and ".n"; the call's own record lists what was touched after the
// last part. A part that touched no patient goes out at once, its ids left to the next record.
func (a *Auditor) settlePart(aw *auditWriter) error {
	if aw.recorder == nil || !aw.recorder.TouchedPatients() {
		return nil
	}
	rec := a.record(aw, aw.r, aw.recorder, aw.start)
	if rec == nil {
		return nil
	}
	aw.parts++
	rec.ID = fmt.Sprintf("%s.%d", rec.ID, aw.parts)
	aw.recorder.Reset()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(aw.r.Context()), a.ackTimeout)
	defer cancel()
	return a.sink.PublishSync(ctx, *rec)
}

// record builds the audit record of a live-key call or of a refused credential, or returns nil
// when the call is not audited.
func (a *Auditor) record(aw *auditWriter, r *http.Request, recorder *access.Recorder, start time.Time) *storage.AuditRecord {
	status := aw.status
	if status == 0 {
		status = http.StatusOK
	}
	call := audit.Call{RequestID: envelope.RequestID(r.Context()), Start: start, UserAgent: r.UserAgent(), Operation: aw.st.operation(r), Status: status}
	p, refusal := aw.st.get()
	if p == nil && refusal != nil {
		return a.refusalRecord(refusal, call)
	}
	if p == nil || p.Mode != access.Live {
		return nil
	}
	rec := call.Record(audit.Caller(p, recorder), a.now())
	if status == http.StatusTooManyRequests && len(rec.PatientIDs) == 0 && len(rec.ResourceIDs) == 0 &&
		!a.limited.admit(p.KeyID, start) {
		return nil
	}
	if rec.Outcome == "success" && r.URL.Path == a.graphqlPath && aw.buffer {
		rec.Outcome = graphQLOutcome(aw.body.Bytes())
	}
	return &rec
}

// Audit records call for the principal in ctx, with the ids the access.Recorder in ctx
// collected; test-mode and anonymous calls are not recorded. When a patient was touched it
// waits (up to the ack timeout) for the broker's acknowledgement and returns an UNAVAILABLE
// fault if none came: the caller must then not send the data. Otherwise it returns at once.
func (a *Auditor) Audit(ctx context.Context, c audit.Call) error {
	p := access.From(ctx)
	if p == nil || p.Mode != access.Live {
		return nil
	}
	rec := c.Record(audit.Caller(p, access.RecorderFrom(ctx)), a.now())
	if len(rec.PatientIDs) == 0 {
		a.sink.Publish(rec)
		return nil
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.ackTimeout)
	defer cancel()
	if err := a.sink.PublishSync(sctx, rec); err != nil {
		return fault.Wrap(fault.KindUnavailable, err, ErrAuditUnavailable.Message)
	}
	return nil
}

// graphQLOutcome reads a GraphQL response (HTTP 200 even on errors): denied when every error is
// FORBIDDEN or UNAUTHENTICATED, error when other errors left no data, else success.
func graphQLOutcome(body []byte) string {
	if !bytes.Contains(body, []byte(`"errors"`)) {
		return "success" // the handler's encoding/json writes the member name as it stands
	}
	var resp struct {
		Data   json.RawMessage `json:"data"`
		Errors []struct {
			Extensions struct {
				Code string `json:"code"`
			} `json:"extensions"`
		} `json:"errors"`
	}
	if json.Unmarshal(body, &resp) != nil || len(resp.Errors) == 0 {
		return "success"
	}
	denied := true
	for _, e := range resp.Errors {
		if e.Extensions.Code != "FORBIDDEN" && e.Extensions.Code != "UNAUTHENTICATED" {
			denied = false
		}
	}
	switch {
	case denied:
		return "denied"
	case len(resp.Data) == 0 || string(resp.Data) == "null":
		return "error"
	}
	return "success"
}

type auditStateKey struct{}

// auditState is what the auditor learns during a request: the principal (set by the
// authenticator, also for calls it refuses) or the refused credential, and, for GraphQL, the
// operation.
type auditState struct {
	a *Auditor

	mu        sync.Mutex
	principal *access.Principal
	refusal   *Refusal
	graphqlOp string
	// graphqlBody is a live POST's body, read ahead, that the operation is named from when
	// graphqlBodyPending is still true as the call is recorded: when the GraphQL handler did not
	// name it from its own parse (SetGraphQLOperation).
	graphqlBody        []byte
	graphqlBodyPending bool
}

func auditStateFrom(ctx context.Context) *auditState {
	st, _ := ctx.Value(auditStateKey{}).(*auditState)
	return st
}

func (st *auditState) setPrincipal(p *access.Principal) {
	st.mu.Lock()
	st.principal = p
	st.mu.Unlock()
}

func (st *auditState) setRefusal(r *Refusal) {
	st.mu.Lock()
	st.refusal = r
	st.mu.Unlock()
}

// get returns the principal, or the refusal of a credential that did not authenticate.
func (st *auditState) get() (*access.Principal, *Refusal) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.principal, st.refusal
}

// authenticated runs once the caller is known. For a live caller of the GraphQL endpoint it
// names the operation from the request: at once for a GET's query string and a body that is a
// GraphQL document (application/graphql), later for a JSON body (operation), which it reads
// ahead, putting back a body the handler reads unchanged, and names only if the GraphQL handler,
// which parses it anyway, does not (SetGraphQLOperation).
func (st *auditState) authenticated(r *http.Request) *http.Request {
	p, _ := st.get()
	if p == nil || p.Mode != access.Live || r.URL.Path != st.a.graphqlPath {
		return r
	}
	var op string
	switch r.Method {
	case http.MethodGet:
		q := r.URL.Query()
		op = GraphQLOperation(q.Get("query"), q.Get("operationName"))
	case http.MethodPost:
		if r.Body == nil {
			break
		}
		peek, err := io.ReadAll(io.LimitReader(r.Body, maxGraphQLPeek+1))
		r.Body = replayBody{Reader: io.MultiReader(bytes.NewReader(peek), errReader{err}, r.Body), Closer: r.Body}
		if err != nil || len(peek) > maxGraphQLPeek {
			op = unparsedOperation
			break
		}
		if ct := r.Header.Get("Content-Type"); isGraphQLDocument(ct) {
			op = graphQLOperationFromBody(ct, peek)
			break
		}
		st.mu.Lock()
		st.graphqlBody, st.graphqlBodyPending = peek, true
		st.mu.Unlock()
		return r
	}
	st.mu.Lock()
	st.graphqlOp = op
	st.mu.Unlock()
	return r
}

// operation names the call: the GraphQL operation, or "<METHOD> <route template>".
func (st *auditState) operation(r *http.Request) string {
	st.mu.Lock()
	op, body, pending := st.graphqlOp, st.graphqlBody, st.graphqlBodyPending
	st.mu.Unlock()
	if pending { // the GraphQL handler did not name it: read the body
		op = graphQLOperationFromBody("application/json", body)
		st.mu.Lock()
		if st.graphqlBodyPending {
			st.graphqlOp, st.graphqlBody, st.graphqlBodyPending = op, nil, false
		}
		op = st.graphqlOp
		st.mu.Unlock()
	}
	if op != "" {
		return op
	}
	if r.URL.Path == st.a.graphqlPath {
		return "graphql " + strings.ToLower(r.Method)
	}
	route := "unmatched"
	if cr := mux.CurrentRoute(r); cr != nil {
		if t, err := cr.GetPathTemplate(); err == nil {
			route = t
		}
	}
	return r.Method + " " + route
}

// isGraphQLDocument reports whether a body of contentType is a GraphQL document itself
// (application/graphql) rather than a JSON request.
func isGraphQLDocument(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "application/graphql"
}

func graphQLOperationFromBody(contentType string, body []byte) string {
	if isGraphQLDocument(contentType) {
		return GraphQLOperation(string(body), "")
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) > 0 && trimmed[0] == '[' {
		return "graphql batch"
	}
	// The two members as json.Unmarshal into a struct of them would read them, without decoding
	// the variables (an event's whole payload) only to drop them.
	var query, operationName string
	if !jsonwire.Valid(body) {
		return unparsedOperation
	}
	err := jsonwire.Members(body, func(key, value []byte) error {
		switch jsonwire.Fold(key, requestMembers) {
		case "query":
			return jsonwire.String(value, &query)
		case "operationName":
			return jsonwire.String(value, &operationName)
		}
		return nil
	})
	if err != nil {
		return unparsedOperation
	}
	return GraphQLOperation(query, operationName)
}

var requestMembers = []string{"query", "operationName"}

// errReader returns err (a read error met while peeking) after the peeked bytes, or nothing.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	return 0, io.EOF
}

type replayBody struct {
	io.Reader
	io.Closer
}

// auditWriter buffers the response of a live-key call until its record is settled, and passes
// every other response straight through. It decides which on first use, by which time the
// authenticator has named the caller. A buffered response that flushes (a streamed export) is
// sent part by part, each once its record is settled (Auditor.settlePart).
type auditWriter struct {
	w        http.ResponseWriter
	st       *auditState
	a        *Auditor
	r        *http.Request
	recorder *access.Recorder
	start    time.Time

	decided bool
	buffer  bool
	header  http.Header // buffer mode: the handler's headers, applied on send
	status  int
	body    bytes.Buffer
	sent    bool  // buffer mode: the status and headers went out (a part was sent)
	parts   int   // part records settled
	err     error // a part's record failed: nothing more is sent
	aborted bool  // finish cut the response short
}

func (aw *auditWriter) decide() {
	if aw.decided {
		return
	}
	aw.decided = true
	p, _ := aw.st.get()
	aw.buffer = p != nil && p.Mode == access.Live
	if aw.buffer {
		aw.header = aw.w.Header().Clone()
	}
}

func (aw *auditWriter) Header() http.Header {
	aw.decide()
	if aw.buffer {
		return aw.header
	}
	return aw.w.Header()
}

func (aw *auditWriter) WriteHeader(code int) {
	aw.decide()
	if aw.buffer {
		if aw.status == 0 && code >= 200 {
			aw.status = code
		}
		return
	}
	if aw.status == 0 && code >= 200 {
		aw.status = code
	}
	aw.w.WriteHeader(code)
}

func (aw *auditWriter) Write(b []byte) (int, error) {
	aw.decide()
	if aw.status == 0 {
		aw.status = http.StatusOK
	}
	if aw.buffer {
		if aw.err != nil {
			return 0, aw.err
		}
		return aw.body.Write(b)
	}
	return aw.w.Write(b)
}

// Flush forwards in pass-through mode. A buffered response sends what it holds once the record
// of the patients it touched is settled (Auditor.settlePart); when that fails the part is
// dropped and every later Write fails, so the handler stops.
func (aw *auditWriter) Flush() {
	aw.decide()
	if !aw.buffer {
		_ = http.NewResponseController(aw.w).Flush()
		return
	}
	if aw.err != nil {
		return
	}
	if err := aw.a.settlePart(aw); err != nil {
		aw.err = fmt.Errorf("audit record of a part: %w", err)
		aw.body.Reset()
		return
	}
	aw.send()
	_ = http.NewResponseController(aw.w).Flush()
}

// Unwrap exposes the underlying writer (WebSocket upgrades, deadlines) in pass-through mode
// only: nothing may bypass the buffer of an audited response.
func (aw *auditWriter) Unwrap() http.ResponseWriter {
	aw.decide()
	if aw.buffer {
		return nil
	}
	return aw.w
}

// send writes out what the buffer holds: the status and headers first, once.
func (aw *auditWriter) send() {
	if !aw.buffer {
		return
	}
	if !aw.sent {
		aw.sent = true
		h := aw.w.Header()
		for k := range h {
			if _, ok := aw.header[k]; !ok {
				delete(h, k)
			}
		}
		for k, v := range aw.header {
			h[k] = v
		}
		status := aw.status
		if status == 0 {
			status = http.StatusOK
		}
		aw.w.WriteHeader(status)
	}
	_, _ = aw.w.Write(aw.body.Bytes())
	aw.body.Reset()
}

// refuse drops the buffered response and answers err instead, keeping only the rate-limit
// headers of what the handler set.
func (aw *auditWriter) refuse(r *http.Request, onError func(http.ResponseWriter, *http.Request, error), err error) {
	h := aw.w.Header()
	for k, v := range aw.header {
		if strings.HasPrefix(k, "Ratelimit-") {
			h[k] = v
		}
	}
	aw.body.Reset()
	onError(aw.w, r, err)
}
