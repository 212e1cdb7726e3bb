// Package server is carehub's HTTP edge: the router every node serves (request ids, recovery,
// access log, metrics, health, error docs) and the routes of the two HTTP roles, mounted on it
// from services the node has already built. It starts nothing: the composition root,
// carehub/cmd/carehub/node, starts the stores and workers and calls it.
package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"carehub/api/envelope"
	"carehub/api/fhir"
	"carehub/api/graphql"
	"carehub/kernel/ids"
)

// httpMetrics counts requests by route template, so cardinality stays bounded.
type httpMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "http",
			Name: "requests_total", Help: "HTTP requests by route, method and status code."}, []string{"route", "method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "carehub", Subsystem: "http",
			Name: "request_duration_seconds", Help: "HTTP request latency by route.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}, []string{"route", "method"}),
	}
	reg.MustRegister(m.requests, m.latency)
	return m
}

type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += n
	return n, err
}

// Unwrap lets http.ResponseController reach Flush and Hijack (WebSocket upgrades).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// AccessLog configures the access log: one line per request (method, route template, status,
// bytes, duration), never the query string, which may carry identifiers of patients.
type AccessLog struct {
	// Level of the lines: slog.LevelInfo or slog.LevelDebug (shown only with --log-level debug).
	Level slog.Level
	// Off: no access lines at all.
	Off bool
	// Sample is the fraction of requests logged, in (0, 1]; 0 means 1. Sampling is by count, not
	// chance (0.1 logs exactly every tenth request), and spares answers ≥ 500, always logged.
	Sample float64
	n      atomic.Uint64
}

// sampled reports whether the request with status code is logged.
func (a *AccessLog) sampled(code int) bool {
	if a.Off {
		return false
	}
	if a.Sample <= 0 || a.Sample >= 1 || code >= 500 {
		return true
	}
	n := a.n.Add(1)
	// Request n is logged when it carries the running count n·Sample past an integer.
	return uint64(float64(n)*a.Sample) > uint64(float64(n-1)*a.Sample)
}

// observe is the outermost middleware: request id, recover, access log, metrics. It logs the
// route template, never the query string, which may carry identifiers of patients.
func observe(logger *slog.Logger, m *httpMetrics, access *AccessLog) mux.MiddlewareFunc {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			id := ids.New(ids.Request)
			w.Header().Set("Request-Id", id)
			l := logger.With("request_id", id)
			ctx := envelope.WithLogger(envelope.WithRequestID(r.Context(), id), l)
			r = r.WithContext(ctx)
			sw := &statusWriter{ResponseWriter: w}
			route := "unmatched"
			if cr := mux.CurrentRoute(r); cr != nil {
				if t, err := cr.GetPathTemplate(); err == nil {
					route = routeLabel(t)
				}
			}
			defer func() {
				if p := recover(); p != nil {
					l.Error("panic serving request", "route", route, "panic", fmt.Sprint(p))
					if sw.status == 0 {
						writeError(sw, r, fmt.Errorf("panic: %v", p))
					}
				}
				code := sw.status
				if code == 0 {
					code = http.StatusOK
				}
				elapsed := time.Since(start)
				m.requests.WithLabelValues(route, r.Method, strconv.Itoa(code)).Inc()
				m.latency.WithLabelValues(route, r.Method).Observe(elapsed.Seconds())
				if route != "/healthz" && route != "/readyz" && route != "/metrics" && access.sampled(code) {
					l.Log(r.Context(), access.Level, "request", "method", r.Method, "route", route, "status", code,
						"bytes", sw.bytes, "duration_ms", elapsed.Milliseconds())
				}
			}()
			next.ServeHTTP(sw, r)
		})
	}
}

// Readiness reports on a node's dependencies for /readyz. verbose asks for what `carehub status`
// shows besides (roles, consumer lags, recent errors); a plain probe costs none of it.
type Readiness func(ctx context.Context, verbose bool) Ready

// Ready is /readyz's answer. /readyz is 503 unless every check is "ok".
type Ready struct {
	// Checks is "ok" or what is wrong, per dependency: "down: <reason>", "waiting: <what>".
	Checks map[string]string `json:"checks"`
	// Degrades names, for each check that is not ok, what the node cannot do meanwhile.
	Degrades map[string]string `json:"degrades,omitempty"`

	// The rest only with ?verbose=true.
	Roles     []string      `json:"roles,omitempty"`
	Consumers []ConsumerLag `json:"consumers,omitempty"`
	// RecentErrors are the node's last error-level log lines, newest last: message and the
	// context keys the node logs (component, consumer, error text), never a request's data.
	RecentErrors []LoggedError `json:"recentErrors,omitempty"`
}

// ConsumerLag is one consumer group the node runs: its lag over every partition of its topic
// and how many of the partitions a member holds.
type ConsumerLag struct {
	Name       string `json:"name"`
	Group      string `json:"group"`
	Topic      string `json:"topic"`
	Lag        int64  `json:"lag"`
	Partitions int    `json:"partitions"`
	Assigned   int    `json:"assigned"`
	Err        string `json:"error,omitempty"`
}

// LoggedError is one error-level log line.
type LoggedError struct {
	Time    time.Time         `json:"time"`
	Message string            `json:"message"`
	Attrs   map[string]string `json:"attrs,omitempty"`
}

// NewRouter returns the router every node serves, whatever its roles: request ids, recovery,
// access log and metrics on every response, strict input, the error envelope for unknown routes
// and methods (OperationOutcomes under the FHIR base), and /healthz, /readyz, /metrics,
// /docs/errors. The roles mount their routes on it.
func NewRouter(logger *slog.Logger, registry *prometheus.Registry, ready Readiness, access *AccessLog) *mux.Router {
	r := mux.NewRouter()
	obs := observe(logger, newHTTPMetrics(registry), access)
	r.Use(obs, envelope.StrictInput(writeError))
	// mux runs middleware only on matched routes; these get it explicitly so every response
	// carries a Request-Id and the error form of its API.
	r.NotFoundHandler = obs(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fhir.Serves(r) {
			fhir.WriteNoRoute(w, r, nil)
			return
		}
		envelope.WriteError(w, r, notFound)
	}))
	r.MethodNotAllowedHandler = obs(methodNotAllowed(r))
	health(r, registry, ready)
	return r
}

// writeError answers an error of the router itself in the form of the API the path belongs to:
// an OperationOutcome under the FHIR base, whose clients parse nothing else, else the envelope.
func writeError(w http.ResponseWriter, r *http.Request, err error) {
	if fhir.Serves(r) {
		fhir.WriteError(w, r, err)
		return
	}
	envelope.WriteError(w, r, err)
}

// methodNotAllowed is envelope.MethodNotAllowed answering in the form of the path's API.
func methodNotAllowed(router *mux.Router) http.Handler {
	rest := envelope.MethodNotAllowed(router)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fhir.Serves(r) {
			fhir.WriteNoRoute(w, r, envelope.AllowedMethods(router, r))
			return
		}
		rest.ServeHTTP(w, r)
	})
}

func health(r *mux.Router, registry *prometheus.Registry, ready Readiness) {
	r.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		envelope.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}).Methods(http.MethodGet)
	r.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		verbose, _ := strconv.ParseBool(r.URL.Query().Get("verbose"))
		rd := ready(r.Context(), verbose)
		status := http.StatusOK
		for _, v := range rd.Checks {
			if v != "ok" {
				status = http.StatusServiceUnavailable
			}
		}
		envelope.WriteJSON(w, status, struct {
			Status string `json:"status"`
			Ready
		}{map[bool]string{true: "ready", false: "not ready"}[status == http.StatusOK], rd})
	}).Methods(http.MethodGet)
	r.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry})).Methods(http.MethodGet)
	r.HandleFunc("/docs/errors", serveErrorDocs).Methods(http.MethodGet)
}

// errorDocs is served at /docs/errors, the docsUrl target of every error envelope.
var errorDocs = [][2]string{
	{envelope.CodeInvalidRequest, "400: the request is malformed (bad JSON, an unknown field or query parameter, a NUL character or invalid UTF-8, a bad parameter or cursor); the message and details.field name what."},
	{envelope.CodeUnauthorized, "401: the API key or token is missing, malformed, invalid, expired or revoked."},
	{envelope.CodeForbidden, "403: the credential may not perform this operation."},
	{envelope.CodeInsufficientScope, "403: the credential lacks the scope the operation requires (see details.requiredScope)."},
	{envelope.CodeIPNotAllowed, "403: the key has an IP allowlist that does not include the caller's address."},
	{envelope.CodeNotFound, "404: the resource does not exist or belongs to another organization."},
	{envelope.CodeMethodNotAllowed, "405: the path is served, but not with this method; the Allow header lists the methods it takes."},
	{envelope.CodeConflict, "409: the resource's state does not allow the operation, or an Idempotency-Key was reused with a different request (method, path or body), or a request with it is still running (retry after Retry-After)."},
	{envelope.CodeTooLarge, "413: the body exceeds the limit (1 MiB; 16 MiB for observation ingest)."},
	{envelope.CodeUnsupportedMedia, "415: the Content-Type is not accepted by this endpoint."},
	{envelope.CodeValidationFailed, "422: the body is well-formed but invalid (see details)."},
	{envelope.CodeRateLimited, "429: too many requests for this credential; retry after Retry-After seconds."},
	{envelope.CodeInternal, "500: an unexpected error; quote the requestId when reporting it."},
	{envelope.CodeUnavailable, "503: a dependency is temporarily unavailable; retry with backoff (after Retry-After when the answer carries it). details.dependency names it when it is a store (clickhouse, postgres); GraphQL answers the same as extensions.code UNAVAILABLE with extensions.dependency. /readyz says which dependency is down and what that degrades."},
	{graphql.CodeResponseTooLarge, "GraphQL: the answer would exceed the answer-size budget of one operation (16 MiB by default; extensions.maxResponseBytes); select fewer large fields (payload, input, output, config), lower the limit arguments or split the operation."},
}

func serveErrorDocs(w http.ResponseWriter, r *http.Request) {
	var b strings.Builder
	b.WriteString("<!doctype html><html><head><meta charset=utf-8><title>carehub error codes</title></head><body><h1>carehub error codes</h1><dl>")
	for _, d := range errorDocs {
		fmt.Fprintf(&b, `<dt id="%s"><code>%s</code></dt><dd>%s</dd>`, d[0], d[0], d[1])
	}
	b.WriteString("</dl></body></html>")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Write([]byte(b.String()))
}
