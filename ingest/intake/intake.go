package intake

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/processors/idempotency"
	"carehub/schemas/kafka/observation"
	"carehub/storage/ids"
	"carehub/storage/kafka"
)

// Defaults of Config.
const (
	DefaultMaxLag         = 200_000
	DefaultLatencyBudget  = time.Second
	DefaultLagInterval    = 250 * time.Millisecond
	DefaultRetryAfter     = 2 * time.Second
	DefaultRequestTimeout = 30 * time.Second
	DefaultProducers      = 16
	DefaultMaxBodyBytes   = 16 << 20
	DefaultMaxEntries     = 10_000
	DefaultMaxFuture      = time.Hour
)

// chunkSize is how many NDJSON lines are validated, looked up and produced together.
const chunkSize = 500

// Media types accepted by POST /v1/observations.
const (
	MediaFHIRJSON   = "application/fhir+json"
	MediaJSON       = "application/json"
	MediaFHIRNDJSON = "application/fhir+ndjson"
	MediaNDJSON     = "application/x-ndjson"
)

// Config configures an Intake.
type Config struct {
	Brokers []string      // required
	Pool    *pgxpool.Pool // required: patient lookups, Idempotency-Key answers
	// Topic receives the observations; default kafka.DefaultTopics().Observations.
	Topic string
	// WriterGroup is the consumer group whose lag is watched; default
	// processors/observations.DefaultGroup.
	WriterGroup string
	// LatencyBudget bounds accept → stored: intake answers 503 with Retry-After while the
	// records waiting to be stored are more than the writers store within it (the limit is
	// fitted to the measured age of the oldest waiting record; see admission); default
	// DefaultLatencyBudget, negative disables it.
	LatencyBudget time.Duration
	// MaxLag is a hard bound on the writer lag (records) past which intake answers 503 with
	// Retry-After whatever the store rate; default DefaultMaxLag, negative disables it.
	MaxLag int64
	// LagInterval is how often the lag is measured; default 250 ms.
	LagInterval time.Duration
	// RetryAfter is the Retry-After of 503 answers when no better one is known (the writers
	// store nothing, a broker fails); default 2 s. Over the latency budget the answer is the
	// estimated time until the backlog fits it again.
	RetryAfter time.Duration
	// RequestTimeout bounds a request from its first byte to its answer, reading the body
	// included; default 30 s. A request over it is aborted (503) and nothing of it is stored.
	RequestTimeout time.Duration
	// Producers is the number of transactional producers, and so of requests producing at
	// once; default 16. A request waits for a free one within its RequestTimeout.
	Producers int
	// TransactionalIDPrefix prefixes the producers' transactional ids; default
	// "carehub-ingest-" and 12 random hex digits, unique per process. A stable prefix per
	// instance lets a restarted instance fence its predecessor's open transactions at once
	// rather than after their timeout; two live instances must never share one.
	TransactionalIDPrefix string
	MaxBodyBytes          int64         // default 16 MiB
	MaxEntries            int           // default 10,000 observations per request
	MaxFuture             time.Duration // how far effectiveDateTime may be ahead of now; default 1 h
	Logger                *slog.Logger  // default: discard
	Registerer            prometheus.Registerer
}

func (c *Config) defaults() error {
	if len(c.Brokers) == 0 {
		return errors.New("observation intake: no Kafka brokers")
	}
	if c.Pool == nil {
		return errors.New("observation intake: no database pool")
	}
	if c.Topic == "" {
		c.Topic = kafka.DefaultTopics().Observations
	}
	if c.WriterGroup == "" {
		c.WriterGroup = observation.WriterGroup
	}
	if c.MaxLag == 0 {
		c.MaxLag = DefaultMaxLag
	}
	if c.LatencyBudget == 0 {
		c.LatencyBudget = DefaultLatencyBudget
	}
	if c.LagInterval <= 0 {
		c.LagInterval = DefaultLagInterval
	}
	if c.RetryAfter <= 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.Producers <= 0 {
		c.Producers = DefaultProducers
	}
	if c.TransactionalIDPrefix == "" {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		c.TransactionalIDPrefix = "carehub-ingest-" + hex.EncodeToString(b)
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxEntries <= 0 {
		c.MaxEntries = DefaultMaxEntries
	}
	if c.MaxFuture <= 0 {
		c.MaxFuture = DefaultMaxFuture
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Intake is the service behind POST /v1/observations (api/rest.ObservationIngestRoutes is its
// transport). Submit reads the caller from the context (kernel/access). Run does its
// background work (lag measurement, Idempotency-Key expiry); Close it after the HTTP server has
// drained. It is safe for concurrent use.
type Intake struct {
	cfg       Config
	producers *producers
	patients  *patientCache
	keys      *keyStore
	adm       *admission  // nil when backpressure is disabled
	lag       *lagWatch   // nil when backpressure is disabled
	lagClient *kgo.Client // nil when backpressure is disabled
	m         *metrics
	logger    *slog.Logger
	closeOnce sync.Once
}

// New returns an Intake; it connects lazily.
func New(cfg Config) (*Intake, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	logger := cfg.Logger.With("component", "observation_intake")
	in := &Intake{
		cfg:       cfg,
		producers: newProducers(cfg.Brokers, cfg.Producers, cfg.TransactionalIDPrefix, cfg.RequestTimeout+30*time.Second, cfg.Logger),
		patients:  newPatientCache(cfg.Pool),
		keys:      &keyStore{pool: cfg.Pool, lease: cfg.RequestTimeout + time.Minute},
		m:         newMetrics(),
		logger:    logger,
	}
	if cfg.MaxLag > 0 || cfg.LatencyBudget > 0 {
		cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: cfg.Brokers, ClientID: "carehub-ingest-lag", Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("observation intake: %w", err)
		}
		in.lagClient = cl
		in.adm = newAdmission(cfg.LatencyBudget, max(20*cfg.LagInterval, 5*time.Second))
		in.lag = &lagWatch{adm: kadm.NewClient(cl), group: cfg.WriterGroup, topic: cfg.Topic, interval: cfg.LagInterval,
			logger: logger, gauge: in.m.lag, a: in.adm}
	}
	if err := in.m.register(cfg.Registerer); err != nil {
		if in.lagClient != nil {
			in.lagClient.Close()
		}
		return nil, fmt.Errorf("observation intake: %w", err)
	}
	return in, nil
}

// Run measures the writers' lag and expires Idempotency-Key answers until ctx is done.
func (in *Intake) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	if in.lag != nil {
		wg.Go(func() { in.lag.run(ctx) })
	}
	defer wg.Wait()
	tick := time.NewTicker(10 * time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if n, err := in.keys.sweep(ctx); err != nil && ctx.Err() == nil {
				in.logger.Warn("expiring idempotency keys failed", "err", err)
			} else if n > 0 {
				in.logger.Debug("idempotency keys expired", "count", n)
			}
		}
	}
}

// Close closes the Kafka clients. It is idempotent.
func (in *Intake) Close() {
	in.closeOnce.Do(func() {
		in.producers.close()
		if in.lagClient != nil {
			in.lagClient.Close()
		}
	})
}

// Lag returns the writers' lag as last measured and whether that measurement is current.
func (in *Intake) Lag() (int64, bool) {
	if in.adm == nil {
		return 0, false
	}
	return in.adm.current(time.Now())
}

// Answer is the body of a 202, and the details of a 422: how many observations were accepted,
// why the others were not, and the ids of the accepted ones in request order.
type Answer struct {
	Accepted int          `json:"accepted"`
	Rejected []EntryError `json:"rejected"`
	IDs      []string     `json:"ids"`
}

// Submission is one POST /v1/observations.
type Submission struct {
	ContentType    string    // selects the format; see MediaFHIRJSON, MediaFHIRNDJSON
	Body           io.Reader // read at most MaxBodyBytes; never buffered whole when NDJSON
	IdempotencyKey string    // optional
}

// Result is what Submit answers besides errors.
type Result struct {
	Answer Answer // the 202 body
	// Replayed says the answer (or the error) is that of an earlier request with the same
	// Idempotency-Key and body.
	Replayed bool
}

// Submit validates the observations of s and commits the valid ones to Kafka in one
// transaction. It returns only after the broker has acknowledged them (the 202 answer), or an
// error of package fault, and then nothing of the request will ever be stored:
//
//   - KindValidation (422) when nothing is valid, or a transaction Bundle has an invalid entry;
//     its Details carry the Answer fields (accepted 0, rejected, ids []);
//   - KindTooLarge (413) over MaxBodyBytes or MaxEntries; KindUnsupportedMedia (415);
//   - KindInvalid (400) for a body that is not JSON, or a malformed Idempotency-Key;
//   - KindConflict (409) for an Idempotency-Key in use by a running request or used with
//     another body;
//   - KindUnavailable (503; answer with Retry-After: RetryAfter) when the writers are past the
//     lag bound, or Kafka or Postgres fail.
//
// With Result.Replayed the result and the error are those of the first request with the key.
// Submit needs write:observations.
func (in *Intake) Submit(ctx context.Context, s Submission) (res Result, err error) {
	var offsets map[int32]int64 // of the request's transaction: its last offset per partition
	received := time.Now()
	ctx, cancel := context.WithTimeout(ctx, in.cfg.RequestTimeout)
	defer cancel()
	format := "unknown"
	defer func() { in.m.requests.WithLabelValues(format, outcome(res, err)).Inc() }()

	p, err := access.Require(ctx, access.WriteObservations)
	if err != nil {
		return Result{}, err
	}
	if lag, fresh := in.Lag(); fresh && in.cfg.MaxLag > 0 && lag > in.cfg.MaxLag {
		in.m.throttled.Inc()
		return Result{}, fault.Unavailable("observation ingest is behind: %d observations wait to be stored; retry later", lag)
	}
	if in.adm != nil {
		tk, wait, ok := in.adm.admit(received)
		if !ok {
			in.m.throttled.Inc()
			return Result{}, fault.Unavailable("observation ingest is behind: more is waiting to be stored than fits its %s budget; room in about %s; retry later",
				in.cfg.LatencyBudget, seconds(wait))
		}
		defer func() { in.adm.done(tk, received, res.Answer.Accepted, offsets) }()
		if wait > 0 {
			hold := time.NewTimer(wait)
			select {
			case <-hold.C:
			case <-ctx.Done():
				hold.Stop()
				return Result{}, fault.Unavailable("observation ingest is behind: the request ended while it waited for room; retry later")
			}
		}
	}
	media, ndjson, err := mediaKind(s.ContentType)
	if err != nil {
		return Result{}, err
	}
	hash := sha256.New()
	hash.Write([]byte(media + "\n"))
	body := io.TeeReader(&limitReader{r: s.Body, left: in.cfg.MaxBodyBytes}, hash)

	key := s.IdempotencyKey
	if key != "" {
		if !idempotency.ValidKey(key) {
			return Result{}, fault.Invalid("Idempotency-Key must be 1 to %d visible ASCII characters", idempotency.MaxKeyLength)
		}
		state, prior, err := in.keys.reserve(ctx, p.OrgID, key)
		if err != nil {
			return Result{}, fault.Wrap(fault.KindUnavailable, err, "idempotency keys are unavailable; retry later")
		}
		switch state {
		case keyInProgress:
			return Result{}, fault.Conflict("a request with this Idempotency-Key is still in progress")
		case keyCompleted:
			if _, err := io.Copy(io.Discard, body); err != nil {
				return Result{}, readError(err)
			}
			if !bytes.Equal(hash.Sum(nil), prior.hash) {
				return Result{}, fault.Conflict("this Idempotency-Key was used with a different request body")
			}
			in.m.replayed.Inc()
			res, err := prior.result()
			res.Replayed = true
			return res, err
		}
	}

	rq := &request{in: in, ctx: ctx, p: p, key: key, lim: limits{now: received, maxFuture: in.cfg.MaxFuture}, received: received}
	var accepted []string
	if ndjson {
		format = "ndjson"
		accepted, err = rq.ndjson(body)
	} else {
		format, accepted, err = rq.json(body)
	}
	offsets = rq.offsets
	sort.SliceStable(rq.rejected, func(i, j int) bool { return rq.rejected[i].Index < rq.rejected[j].Index })
	for _, e := range rq.rejected {
		in.m.rejected.WithLabelValues(e.Code).Inc()
	}
	in.m.requestSize.Observe(float64(rq.entries))
	switch {
	case err != nil:
	case len(accepted) == 0:
		msg := "no observation in the request is valid; nothing was accepted"
		if rq.entries == 0 {
			msg = "the request holds no observation"
		}
		err = rq.invalid(msg)
	default:
		in.m.accepted.Add(float64(len(accepted)))
		res.Answer = Answer{Accepted: len(accepted), Rejected: nonNil(rq.rejected), IDs: accepted}
	}
	if key != "" {
		var kerr error
		if a, ok := storable(res, err, hash.Sum(nil)); ok {
			kerr = in.keys.complete(p.OrgID, key, a)
		} else {
			kerr = in.keys.release(p.OrgID, key)
		}
		if kerr != nil {
			in.logger.Error("idempotency key not recorded", "err", kerr)
		}
	}
	return res, err
}

// RetryAfter is how long a client should wait after a 503 from Submit: over the latency
// budget, the estimated time until what waits fits it again (1 s to twice the budget);
// otherwise (the writers store nothing, a broker failed) Config.RetryAfter.
func (in *Intake) RetryAfter() time.Duration {
	var wait time.Duration
	if in.adm != nil {
		wait = in.adm.wait(time.Now())
	}
	if wait <= 0 || wait == time.Duration(math.MaxInt64) {
		return in.cfg.RetryAfter
	}
	return max(min(wait, budgetsPerRetry*in.cfg.LatencyBudget), time.Second)
}

// RequestTimeout bounds a Submit; transports bound reading the body by it too.
func (in *Intake) RequestTimeout() time.Duration { return in.cfg.RequestTimeout }

// MaxBodyBytes is the body limit of a Submission.
func (in *Intake) MaxBodyBytes() int64 { return in.cfg.MaxBodyBytes }

// outcome labels a Submit for carehub_ingest_requests_total.
func outcome(res Result, err error) string {
	if res.Replayed {
		return "replayed"
	}
	if err == nil {
		return "accepted"
	}
	switch fault.KindOf(err) {
	case fault.KindValidation:
		return "invalid"
	case fault.KindTooLarge:
		return "too_large"
	case fault.KindUnsupportedMedia:
		return "unsupported_media"
	case fault.KindInvalid:
		return "bad_request"
	case fault.KindConflict:
		return "conflict"
	case fault.KindUnavailable:
		return "unavailable"
	case fault.KindUnauthenticated, fault.KindInsufficientScope, fault.KindForbidden:
		return "denied"
	}
	return "error"
}

// limitReader fails with a 413 fault once more than left bytes are read.
type limitReader struct {
	r    io.Reader
	left int64
	max  int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.max == 0 {
		l.max = l.left
	}
	if l.left < 0 {
		return 0, errBodyTooLarge(l.max)
	}
	if int64(len(p)) > l.left+1 {
		p = p[:l.left+1]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if l.left < 0 {
		return n, errBodyTooLarge(l.max)
	}
	return n, err
}

func errBodyTooLarge(limit int64) error {
	return &fault.Error{Kind: fault.KindTooLarge, Message: fmt.Sprintf("the body exceeds %d bytes; nothing was accepted", limit),
		Details: map[string]any{"maxBytes": limit}}
}

// request is the state of one POST /v1/observations.
type request struct {
	in       *Intake
	ctx      context.Context
	p        *access.Principal
	key      string
	lim      limits
	received time.Time

	offsets  map[int32]int64 // of the committed transaction: its last offset per partition
	entries  int             // entries seen, valid or not
	rejected []EntryError    // in the order found; sorted by index before answering
	txn      *txn            // begun at the first valid record
}

// entry is one observation of a request before validation; err is set when the envelope
// around it (a bundle entry) is already wrong.
type entry struct {
	index int
	raw   []byte
	err   *EntryError
}

// json handles a single Observation or a Bundle: the body is one JSON document (at most
// MaxBodyBytes), read whole, validated whole, and produced in one transaction.
func (rq *request) json(body io.Reader) (format string, accepted []string, err error) {
	data, err := io.ReadAll(body)
	if err != nil {
		return "unknown", nil, readError(err)
	}
	head, err := readDocument(data, rq.in.cfg.MaxEntries)
	if err != nil {
		return "unknown", nil, err
	}
	var entries []entry
	transaction := false
	switch head.resourceType {
	case "Observation":
		format = "observation"
		entries = []entry{{index: 0, raw: data}}
	case "Bundle":
		switch head.bundleType {
		case "batch", "collection": // a collection is what devices and exports send: taken like a batch
			format = "batch"
		case "transaction":
			format, transaction = "transaction", true
		default:
			return "bundle", nil, fault.Validation("Bundle.type must be batch, transaction or collection",
				map[string]string{"type": "must be batch, transaction or collection"})
		}
		if head.tooMany {
			return format, nil, tooManyEntries(rq.in.cfg.MaxEntries)
		}
		entries = head.entries
	default:
		rq.entries = 1
		rq.reject(0, entryErr(CodeInvalidResource, "resourceType must be Observation or Bundle, not %q", truncate(head.resourceType)))
		return "unknown", nil, nil
	}
	rq.entries = len(entries)
	recs, ids, err := rq.validate(entries)
	if err != nil {
		return format, nil, err
	}
	if transaction && len(rq.rejected) > 0 {
		return format, nil, rq.invalid(fmt.Sprintf("transaction bundle rejected: %d of %d entries are invalid; nothing was accepted",
			len(rq.rejected), len(entries)))
	}
	if len(recs) == 0 {
		return format, nil, nil
	}
	if err := rq.produce(recs); err != nil {
		return format, nil, err
	}
	if err := rq.commit(); err != nil {
		return format, nil, err
	}
	return format, ids, nil
}

// document is the top level of a JSON body: its resourceType, and for a Bundle its type and
// entries.
type document struct {
	resourceType string
	bundleType   string
	entries      []entry // of an "entry" array, whatever the resourceType
	tooMany      bool    // the entry array is longer than the limit (the rest is not kept)
}

// readDocument walks data once with a streaming decoder: each Bundle entry is decoded as it
// is reached (its resource kept as raw bytes) instead of validating and copying the whole
// body several times over. A body that is not one JSON object, or whose entry is not an
// array, is 400.
func readDocument(data []byte, maxEntries int) (document, error) {
	var doc document
	bad := func(err error) (document, error) {
		msg := "the body must be a FHIR Observation or Bundle as a JSON object"
		if err != nil {
			msg += ": " + strings.TrimPrefix(err.Error(), "json: ")
		}
		return document{}, fault.Invalid("%s", msg)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return bad(err)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return bad(err)
		}
		switch tok {
		case "resourceType":
			err = dec.Decode(&doc.resourceType)
		case "type":
			err = dec.Decode(&doc.bundleType)
		case "entry":
			err = readEntries(dec, &doc, maxEntries)
		default:
			var skip json.RawMessage
			err = dec.Decode(&skip)
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && (tok == "resourceType" || tok == "type") {
			err = nil // a non-string resourceType or type is judged below, like a wrong one
		}
		if err != nil {
			return bad(err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return bad(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return bad(errors.New("data after the object"))
	}
	return doc, nil
}

// bundleEntry is one element of Bundle.entry.
type bundleEntry struct {
	Resource json.RawMessage `json:"resource"`
	Request  *struct {
		Method string `json:"method"`
		URL    string `json:"url"`
	} `json:"request"`
}

// readEntries reads the entry array, one entry at a time; past maxEntries it only skips.
func readEntries(dec *json.Decoder, doc *document, maxEntries int) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		return nil // "entry": null
	}
	if tok != json.Delim('[') {
		return errors.New("Bundle.entry must be an array")
	}
	for i := 0; dec.More(); i++ {
		if i >= maxEntries {
			doc.tooMany = true
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return err
			}
			continue
		}
		var e bundleEntry
		err := dec.Decode(&e)
		var te *json.UnmarshalTypeError
		if err != nil && !errors.As(err, &te) {
			return err
		}
		x := entry{index: i}
		switch {
		case err != nil:
			x.err = entryErr(CodeInvalidEntry, "the entry must be an object with a resource (and optionally a request)")
		case len(e.Resource) == 0 || string(e.Resource) == "null":
			x.err = entryErr(CodeInvalidEntry, "the entry has no resource")
		case e.Request != nil && (e.Request.Method != http.MethodPost || !(e.Request.URL == "Observation" || strings.HasSuffix(e.Request.URL, "/Observation"))):
			x.err = entryErr(CodeInvalidEntry, "only POST Observation entries are accepted")
		default:
			x.raw = e.Resource
		}
		doc.entries = append(doc.entries, x)
	}
	_, err = dec.Token() // the closing bracket
	return err
}

// ndjson handles a FHIR NDJSON stream: one Observation per line, read with a bounded buffer,
// validated and produced chunkSize lines at a time inside one transaction committed at the end.
func (rq *request) ndjson(body io.Reader) ([]string, error) {
	br := bufio.NewReaderSize(body, MaxEntryBytes+2)
	chunk := make([]entry, 0, chunkSize)
	var accepted []string
	flush := func() error {
		recs, ids, err := rq.validate(chunk)
		chunk = chunk[:0]
		if err != nil {
			return err
		}
		accepted = append(accepted, ids...)
		return rq.produce(recs)
	}
	for line := 0; ; line++ {
		b, tooLong, err := readLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			rq.abort()
			return nil, readError(err)
		}
		if b = bytes.TrimSpace(b); len(b) > 0 || tooLong {
			rq.entries++
			if rq.entries > rq.in.cfg.MaxEntries {
				rq.abort()
				return nil, tooManyEntries(rq.in.cfg.MaxEntries)
			}
			e := entry{index: line, raw: bytes.Clone(b)}
			if tooLong {
				e.err = entryErr(CodeEntryTooLarge, "the line is longer than %d bytes", MaxEntryBytes)
			}
			chunk = append(chunk, e)
			if len(chunk) == chunkSize {
				if err := flush(); err != nil {
					rq.abort()
					return nil, err
				}
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
	}
	if len(chunk) > 0 {
		if err := flush(); err != nil {
			rq.abort()
			return nil, err
		}
	}
	if len(accepted) == 0 {
		rq.abort()
		return nil, nil
	}
	if err := rq.commit(); err != nil {
		return nil, err
	}
	return accepted, nil
}

// readLine returns the next line (valid until the next read), or tooLong when it does not fit
// the reader's buffer, in which case the rest of the line has been skipped.
func readLine(br *bufio.Reader) (line []byte, tooLong bool, err error) {
	b, err := br.ReadSlice('\n')
	if !errors.Is(err, bufio.ErrBufferFull) {
		return b, false, err
	}
	for errors.Is(err, bufio.ErrBufferFull) {
		_, err = br.ReadSlice('\n')
	}
	return nil, true, err
}

// validate checks entries, looks up their patients in one query, and returns the records of
// the valid ones with their ids; the invalid ones are added to rq.rejected.
func (rq *request) validate(entries []entry) ([]*kgo.Record, []string, error) {
	msgs := make([]parsed, 0, len(entries))
	indexes := make([]int, 0, len(entries))
	patientIDs := make([]string, 0, 8)
	seen := map[string]bool{}
	for _, e := range entries {
		if e.err != nil {
			rq.reject(e.index, e.err)
			continue
		}
		p, ee := parseEntry(e.raw, rq.lim)
		if ee != nil {
			rq.reject(e.index, ee)
			continue
		}
		msgs = append(msgs, p)
		indexes = append(indexes, e.index)
		if id := p.msg.PatientID; !seen[id] {
			seen[id] = true
			patientIDs = append(patientIDs, id)
		}
	}
	if len(msgs) == 0 {
		return nil, nil, nil
	}
	found, err := rq.in.patients.lookup(rq.ctx, patientIDs)
	if err != nil {
		return nil, nil, fault.Wrap(fault.KindUnavailable, err, "patient lookup failed; nothing was accepted, retry later")
	}
	recs := make([]*kgo.Record, 0, len(msgs))
	accepted := make([]string, 0, len(msgs))
	for i := range msgs {
		m := &msgs[i].msg
		pe := found[m.PatientID]
		if !pe.visibleTo(rq.p) {
			rq.reject(indexes[i], entryErr(CodeUnknownPatient, "patient %q not found", m.PatientID))
			continue
		}
		m.OrgID = pe.orgID
		m.ReceivedAt = rq.received
		m.ID = rq.observationID(m, indexes[i])
		access.Touch(rq.ctx, access.KindPatient, m.PatientID)
		parts, err := partMessages(m, msgs[i].parts)
		if err != nil {
			return nil, nil, err // not reached: the panel was decoded once already
		}
		recs = append(recs, rq.record(m))
		for j := range parts {
			recs = append(recs, rq.record(&parts[j]))
		}
		accepted = append(accepted, m.ID)
	}
	return recs, accepted, nil
}

func (rq *request) record(m *observation.Message) *kgo.Record {
	return &kgo.Record{Topic: rq.in.cfg.Topic, Key: []byte(m.PatientID), Value: m.AppendJSON(make([]byte, 0, len(m.Observation)+384))}
}

// observationID is the id of an accepted observation. With Observation.id it is derived from
// (organization, that id), so the same client id is the same observation however often it is
// sent; else with an Idempotency-Key from (organization, key, entry index), so a retry after an
// unknown outcome repeats the ids; else new.
func (rq *request) observationID(m *observation.Message, index int) string {
	switch {
	case m.ClientID != "":
		return DerivedID(m.OrgID, "id", m.ClientID)
	case rq.key != "":
		return DerivedID(m.OrgID, "key", rq.key+"\x00"+strconv.Itoa(index))
	}
	return ids.New(ids.Observation)
}

// DerivedID returns obs_ and a ULID made of the first 16 bytes of SHA-256(kind, org, value): a
// stable id for a client-chosen name. Derived ids are not time-ordered.
func DerivedID(orgID, kind, value string) string {
	h := sha256.Sum256([]byte("carehub/observation\x00" + kind + "\x00" + orgID + "\x00" + value))
	var u [16]byte
	copy(u[:], h[:16])
	return ids.Observation + ulidString(u)
}

func (rq *request) produce(recs []*kgo.Record) error {
	if len(recs) == 0 {
		return nil
	}
	if rq.txn == nil {
		t, err := rq.in.producers.acquire(rq.ctx)
		if err != nil {
			return fault.Wrap(fault.KindUnavailable, err, "no observation producer is free; nothing was accepted, retry later")
		}
		rq.txn = t
	}
	if err := rq.txn.produce(rq.ctx, recs); err != nil {
		rq.abort()
		return unavailable(err)
	}
	return nil
}

func (rq *request) commit() error {
	start := time.Now()
	err := rq.txn.commit(rq.ctx)
	rq.offsets = rq.txn.last
	rq.txn = nil
	if err != nil {
		rq.in.logger.Warn("observations not committed to Kafka; answered 503", "err", err)
		return unavailable(err)
	}
	rq.in.m.produce.Observe(time.Since(start).Seconds())
	return nil
}

func (rq *request) abort() {
	if rq.txn != nil {
		rq.txn.abort()
		rq.txn = nil
	}
}

func (rq *request) reject(index int, e *EntryError) {
	rq.rejected = append(rq.rejected, EntryError{Index: index, Code: e.Code, Message: e.Message})
}

// invalid is the 422 of a request of which nothing was accepted, with the answer as details.
func (rq *request) invalid(message string) error {
	sort.SliceStable(rq.rejected, func(i, j int) bool { return rq.rejected[i].Index < rq.rejected[j].Index })
	return &fault.Error{Kind: fault.KindValidation, Message: message,
		Details: map[string]any{"accepted": 0, "rejected": nonNil(rq.rejected), "ids": []string{}}}
}

func unavailable(err error) error {
	return fault.Wrap(fault.KindUnavailable, err, "the observation stream is unavailable; nothing was accepted, retry later")
}

func tooManyEntries(n int) error {
	return &fault.Error{Kind: fault.KindTooLarge, Message: fmt.Sprintf("a request may hold at most %d observations; nothing was accepted", n),
		Details: map[string]any{"maxEntries": n}}
}

// readError classifies a failure to read the body: too large (413), or a broken or timed out
// upload (400; the client will hardly see it).
func readError(err error) error {
	if fault.KindOf(err) == fault.KindTooLarge {
		return err
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return errBodyTooLarge(mbe.Limit)
	}
	return fault.Wrap(fault.KindInvalid, err, "the request body could not be read")
}

// mediaKind maps Content-Type to the body format.
func mediaKind(contentType string) (media string, ndjson bool, err error) {
	mt, _, perr := mime.ParseMediaType(contentType)
	switch {
	case perr != nil && contentType != "":
	case mt == MediaFHIRJSON || mt == MediaJSON:
		return mt, false, nil
	case mt == MediaFHIRNDJSON || mt == MediaNDJSON || mt == "application/ndjson":
		return mt, true, nil
	}
	return "", false, fault.New(fault.KindUnsupportedMedia,
		"Content-Type must be %s or %s (an Observation or a Bundle) or %s (one Observation per line)", MediaFHIRJSON, MediaJSON, MediaFHIRNDJSON)
}

func nonNil(e []EntryError) []EntryError {
	if e == nil {
		return []EntryError{}
	}
	return e
}
