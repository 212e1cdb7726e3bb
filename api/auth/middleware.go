package auth

import (
	"errors"
	"io"
	"net/http"
	"strings"

	"carehub/api/envelope"
	"carehub/kernel/access"
	"carehub/kernel/fault"
)

// Middleware authenticates every request, applies the rate limits of its credential and of its
// organization and the credential's bound on requests in progress (Limits.InFlight), and puts the principal in the request context
// (access.With). A request it refuses gets onError (nil means
// envelope.WriteError) with a fault: UNAUTHORIZED (401), IP_NOT_ALLOWED (403), RATE_LIMITED (429,
// with Retry-After) or UNAVAILABLE (503, the key store is down). Every response to an
// authenticated request carries RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset.
//
// The limit class is ClassIngest for requests Limits.IsIngest selects (POST /v1/observations),
// ClassDefault otherwise; each class has its own buckets.
//
// WebSocket upgrades of the subscription path pass through unauthenticated: browsers cannot
// set headers on them, so their credential arrives in connection_init and the WebSocket handler
// authenticates it with Authenticate.
//
// Placed inside an Auditor's middleware, it tells the auditor which key a call was made with,
// refused calls included, or what was refused when the credential did not authenticate.
func (a *Authenticator) Middleware(onError func(http.ResponseWriter, *http.Request, error)) func(http.Handler) http.Handler {
	if onError == nil {
		onError = envelope.WriteError
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == a.wsPath && isWebSocketUpgrade(r) {
				next.ServeHTTP(w, r)
				return
			}
			ctx := r.Context()
			p, err := a.Authenticate(ctx, r.Header.Get("Authorization"), a.clientIP(r))
			st := auditStateFrom(ctx)
			if st != nil {
				var refusal *Refusal
				switch {
				case p != nil:
					st.setPrincipal(p)
				case errors.As(err, &refusal):
					st.setRefusal(refusal)
				}
			}
			if err != nil {
				onError(w, r, err)
				return
			}
			d, whose := a.takeRate(r, p)
			d.setHeaders(w.Header())
			if !d.allowed {
				onError(w, r, fault.New(fault.KindRateLimited, "rate limit exceeded for %s: retry after %s seconds",
					whose, w.Header().Get("Retry-After")))
				return
			}
			if !a.inFlight.acquire(p.KeyID) {
				w.Header().Set("Retry-After", "1")
				onError(w, r, fault.New(fault.KindRateLimited, "%d requests of this credential are in progress already: retry after 1 second",
					a.limits.InFlight))
				return
			}
			defer a.inFlight.release(p.KeyID)
			r = r.WithContext(access.With(ctx, p))
			if st != nil {
				r = st.authenticated(r)
			}
			next.ServeHTTP(w, r)
		})
	}
}

// takeRate takes a token of r's class from p's credential and then from its organization, and
// returns the decision the RateLimit headers report: the refusal, or of the two buckets the one
// with fewer requests left. whose names the bucket that refused.
func (a *Authenticator) takeRate(r *http.Request, p *access.Principal) (d decision, whose string) {
	class, now := a.limits.class(r), a.now()
	d = a.rate[class].take(p.KeyID, now)
	if !d.allowed || p.OrgID == "" {
		return d, "this credential"
	}
	od := a.orgRate[class].take(p.OrgID, now)
	if !od.allowed || od.remaining < d.remaining {
		return od, "this organization's keys together"
	}
	return d, ""
}

func isWebSocketUpgrade(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.EqualFold(r.Header.Get("Upgrade"), "websocket") &&
		headerHasToken(r.Header, "Connection", "upgrade")
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// Body size limits of DECISIONS §3.
const (
	DefaultBodyLimit int64 = 1 << 20  // 1 MiB
	IngestBodyLimit  int64 = 16 << 20 // 16 MiB, POST /v1/observations
)

// LimitBody limits request bodies to n bytes: a declared Content-Length above n is refused at
// once with 413 PAYLOAD_TOO_LARGE, and reading past n fails with *http.MaxBytesError, which
// envelope.WriteError maps to the same. The innermost LimitBody wins, so a router-wide
// LimitBody(DefaultBodyLimit) and a route's LimitBody(IngestBodyLimit) compose as expected.
func LimitBody(n int64) func(http.Handler) http.Handler { return LimitBodyWith(n, envelope.WriteError) }

// LimitBodyWith is LimitBody answering a refused Content-Length with onError (nil: the REST
// envelope): the FHIR base answers in an OperationOutcome.
func LimitBodyWith(n int64, onError func(http.ResponseWriter, *http.Request, error)) func(http.Handler) http.Handler {
	if onError == nil {
		onError = envelope.WriteError
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.ContentLength > n {
				onError(w, r, fault.New(fault.KindTooLarge, "request body of %d bytes exceeds the limit of %d bytes", r.ContentLength, n))
				return
			}
			if r.Body != nil && r.Body != http.NoBody {
				orig := r.Body
				if lb, ok := orig.(*limitedBody); ok {
					orig = lb.orig
				}
				r.Body = &limitedBody{ReadCloser: http.MaxBytesReader(w, orig, n), orig: orig}
			}
			next.ServeHTTP(w, r)
		})
	}
}

// limitedBody remembers the unlimited body so that an inner LimitBody can replace the limit
// rather than nest inside it.
type limitedBody struct {
	io.ReadCloser
	orig io.ReadCloser
}
