// Package idempotency serves the Idempotency-Key header (DECISIONS §3) on the REST routes and on
// GraphQL mutations: the first request with a key runs; a later one with the same key and the
// same request (method, path, query and body bytes) gets the first answer again, with
// Idempotent-Replayed: true, for 24 hours; the same key with another request is 409 CONFLICT, and
// so is a request whose key is held by a request still running (Retry-After: 1).
//
// Keys belong to the credential (organization and API key id; a JWT counts as its parent key).
// Scope checks and patient-data rules run in the handler, which a replay skips, so an answer is
// replayed only to a credential with the same scopes and mode as the one that got it first: a
// JWT narrowed from the key, or the key after its scopes changed, gets 409 CONFLICT instead.
// A key is 1 to 255 visible ASCII characters, sent once; anything else is 400 INVALID_REQUEST.
//
// What is kept: every answer the handler gave that is about the request, 2xx and 4xx, except
// 408, 425 and 429, which say "not now" rather than answering (a 4xx such as 422 is kept, as
// Stripe keeps it: the same body would get the same answer). 5xx answers, and answers over 1 MiB,
// are not kept: the key is released so a retry can succeed. A retry never repeats an effect that
// committed: services write effects through storage/idempotency.Tx, which records each
// committed step with the claim, so a retry after a 5xx or after the node died resumes after
// the steps that committed (its answer then also carries Idempotent-Replayed: true).
//
// Where the header is honoured: REST POST and PATCH routes, except POST /v1/auth/token (it
// changes nothing; each call mints a fresh short-lived token, and a token is a credential not
// worth storing for replay); GraphQL POST requests whose operation is a mutation (the key covers
// the whole request, every mutation in it). PUT and DELETE are idempotent by method and ignore
// the header, as do GraphQL queries. POST /v1/observations keeps its own handling
// (ingest/intake): its 16 MiB bodies are streamed, not buffered.
package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/vektah/gqlparser/v2/ast"

	"carehub/api/envelope"
	"carehub/api/graphql"
	"carehub/api/graphql/gqldoc"
	"carehub/kernel/access"
	"carehub/kernel/fault"
	core "carehub/storage/idempotency"
)

// Header names.
const (
	Header         = "Idempotency-Key"
	ReplayedHeader = "Idempotent-Replayed"
)

// maxAnswer bounds an answer kept for replay.
const maxAnswer = 1 << 20

// keptHeaders are the headers of an answer that its replays repeat; the others (Request-Id,
// RateLimit-*) belong to each request.
var keptHeaders = []string{"Content-Type", "Location", "Link", "Allow"}

// errBadKey answers a malformed key.
var errBadKey = &fault.Error{Kind: fault.KindInvalid,
	Message: "Idempotency-Key must be sent once, as 1 to 255 visible ASCII characters (no spaces or control characters)",
	Details: map[string]any{"header": Header}}

// Middleware serves Idempotency-Key on the routes it wraps, which must run the authentication
// middleware first (the key belongs to the credential).
type Middleware struct {
	store  *core.Store
	logger *slog.Logger
}

// New returns the middleware over store.
func New(store *core.Store, logger *slog.Logger) *Middleware {
	if logger == nil {
		logger = slog.Default()
	}
	return &Middleware{store: store, logger: logger}
}

// policy is what differs between REST and GraphQL.
type policy struct {
	applies func(r *http.Request, body []byte) bool
	keep    func(status int, body []byte) bool
	onError func(http.ResponseWriter, *http.Request, error)
}

// REST serves the key on the REST routes' POST and PATCH requests but POST /v1/auth/token.
// Refusals are REST error envelopes.
func (m *Middleware) REST() func(http.Handler) http.Handler {
	return m.handler(policy{
		applies: func(r *http.Request, _ []byte) bool { return r.URL.Path != "/v1/auth/token" },
		keep:    keepREST,
		onError: envelope.WriteError,
	})
}

// GraphQL serves the key on POST requests of the GraphQL route whose operation is a mutation.
// Refusals are written by onError (graphql.WriteAuthError: the REST status, with a body that
// carries both the REST error and a GraphQL errors array).
func (m *Middleware) GraphQL(onError func(http.ResponseWriter, *http.Request, error)) func(http.Handler) http.Handler {
	return m.handler(policy{applies: isMutation, keep: keepGraphQL, onError: onError})
}

func (m *Middleware) handler(p policy) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			keys := r.Header.Values(Header)
			caller := access.From(r.Context())
			if len(keys) == 0 || caller == nil || (r.Method != http.MethodPost && r.Method != http.MethodPatch) {
				next.ServeHTTP(w, r)
				return
			}
			body, err := io.ReadAll(r.Body)
			if err != nil {
				var tooLarge *http.MaxBytesError
				if !errors.As(err, &tooLarge) {
					err = fault.Invalid("cannot read the request body")
				}
				p.onError(w, r, err)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			if !p.applies(r, body) {
				next.ServeHTTP(w, r)
				return
			}
			if len(keys) > 1 || !core.ValidKey(keys[0]) {
				p.onError(w, r, errBadKey)
				return
			}
			m.serve(w, r, next, p, core.ScopeOf(caller), keys[0], body)
		})
	}
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler, p policy, scope core.Scope, key string, body []byte) {
	claim, answer, err := m.store.Claim(r.Context(), scope, key, requestHash(r, body))
	switch {
	case errors.Is(err, core.ErrInProgress):
		w.Header().Set("Retry-After", "1")
		p.onError(w, r, err)
		return
	case err != nil:
		p.onError(w, r, err)
		return
	case answer != nil:
		replay(w, r, answer)
		return
	}
	rec := &recorder{ResponseWriter: w, claim: claim}
	// The answer is recorded, or the claim released, also when the client has gone away.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
	defer cancel()
	defer func() {
		if v := recover(); v != nil {
			m.end(ctx, claim, nil)
			panic(v)
		}
	}()
	next.ServeHTTP(rec, r.WithContext(core.With(r.Context(), claim)))
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	var a *core.Answer
	if !rec.overflow && p.keep(rec.status, rec.body.Bytes()) {
		a = &core.Answer{Status: rec.status, Header: http.Header{}, Body: rec.body.Bytes()}
		for _, h := range keptHeaders {
			if v := w.Header().Values(h); len(v) > 0 {
				a.Header[h] = v
			}
		}
		if ar := access.RecorderFrom(r.Context()); ar != nil {
			a.Patients, a.Resources = ar.PatientIDs(), ar.ResourceIDs()
		}
	}
	m.end(ctx, claim, a)
}

// end records a (nil: releases the claim). The answer is sent already; a failure here only costs
// a retry its replay, so it is logged.
func (m *Middleware) end(ctx context.Context, c *core.Claim, a *core.Answer) {
	var err error
	if a != nil {
		err = c.Complete(ctx, *a)
	} else {
		err = c.Release(ctx)
	}
	if err != nil {
		envelope.LoggerFrom(ctx).Warn("ending an idempotency key failed", "err", err)
	}
}

// replay sends a recorded answer, and touches the resources the first request touched, so the
// replay's audit record names the same patients.
func replay(w http.ResponseWriter, r *http.Request, a *core.Answer) {
	for _, id := range a.Patients {
		access.Touch(r.Context(), access.KindPatient, id)
	}
	for _, id := range a.Resources {
		access.Touch(r.Context(), "resource", id) // patients among them are recorded already
	}
	h := w.Header()
	for k, v := range a.Header {
		h[k] = v
	}
	h.Set(ReplayedHeader, "true")
	h.Set("Content-Length", strconv.Itoa(len(a.Body)))
	w.WriteHeader(a.Status)
	w.Write(a.Body)
}

// requestHash identifies what a key was used for: method, path, query and body bytes.
func requestHash(r *http.Request, body []byte) []byte {
	h := sha256.New()
	for _, s := range []string{r.Method, r.URL.Path, r.URL.RawQuery} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	h.Write(body)
	return h.Sum(nil)
}

// keepREST: answers about the request are kept, "not now" and server failures are not.
func keepREST(status int, _ []byte) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status < 500
}

// keepGraphQL: executed operations answer 200; one that met an internal error or a rate limit
// (its errors' extensions.code) is not kept, as a REST 5xx or 429 is not.
func keepGraphQL(status int, body []byte) bool {
	if status != http.StatusOK {
		return keepREST(status, body)
	}
	var res struct {
		Errors []struct {
			Extensions struct{ Code string }
		}
	}
	if json.Unmarshal(body, &res) != nil {
		return false
	}
	for _, e := range res.Errors {
		switch e.Extensions.Code {
		case graphql.CodeInternal, graphql.CodeRateLimited, graphql.CodeUnavailable:
			return false
		}
	}
	return true
}

// isMutation reports whether a GraphQL request body selects a mutation operation.
func isMutation(_ *http.Request, body []byte) bool {
	var req struct{ Query, OperationName string }
	if json.Unmarshal(body, &req) != nil {
		return false
	}
	doc, err := gqldoc.Parse(req.Query) // the parse the GraphQL handler then reuses
	if err != nil {
		return false
	}
	op := gqldoc.Operation(doc, req.OperationName)
	return op != nil && op.Operation == ast.Mutation
}

// recorder passes the answer through and keeps a copy of it.
type recorder struct {
	http.ResponseWriter
	claim    *core.Claim
	status   int
	body     bytes.Buffer
	overflow bool
}

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		if w.claim.Replayed() {
			w.Header().Set(ReplayedHeader, "true")
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.overflow {
		if w.body.Len()+len(b) > maxAnswer {
			w.overflow = true
			w.body = bytes.Buffer{}
		} else {
			w.body.Write(b)
		}
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }
