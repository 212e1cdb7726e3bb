package rest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"carehub/processors/agents"
	"carehub/processors/deployments"
	"carehub/processors/fault"
	"carehub/processors/feed"
	"carehub/processors/marketplace"
	"carehub/processors/orgs"
	"carehub/processors/webhooks"
	"carehub/processors/workflows"
	"carehub/schemas"
)

// WebhookLister is what the REST routes need of the webhook service (*webhooks.Service).
type WebhookLister interface {
	List(ctx context.Context, projectID string) ([]webhooks.Subscription, error)
}

// Services are the domain services behind the routes Mount serves.
type Services struct {
	Orgs        *orgs.Service
	Marketplace *marketplace.Service
	Deployments *deployments.Service
	Agents      *agents.Service
	Workflows   *workflows.Service
	Feed        *feed.Service
	Webhooks    WebhookLister
}

// Mount adds the REST routes of the spec's platform resources: to public those that need no
// credential, to authed (a router whose middleware authenticates) the others.
//
//	GET  /v1/openapi.json              the OpenAPI 3.1 document of every REST route (public)
//	GET  /v1/event-types               the event-type catalogue (public)
//	GET  /v1/organizations             organizations, cursor-paginated
//	GET  /v1/organizations/{id}        one organization
//	GET  /v1/projects/{id}             one project
//	GET  /v1/assets                    marketplace assets, filtered, cursor-paginated
//	GET  /v1/agents/{id}               one agent
//	GET  /v1/workflows/{id}            one workflow
//	GET  /v1/workflow-runs/{id}        one workflow run
//	GET  /v1/deployments/{id}          one deployment
//	GET  /v1/events                    a project's events, newest first, cursor-paginated
//	GET  /v1/webhooks                  a project's webhook subscriptions, secrets masked
//	POST /api/v1/workflows/runs        start a workflow run (trigger "event")
func Mount(public, authed *mux.Router, s Services) {
	h := &handlers{s}
	public.HandleFunc("/v1/openapi.json", serveOpenAPI).Methods(http.MethodGet)
	public.HandleFunc("/v1/event-types", serveEventTypes).Methods(http.MethodGet)
	for path, fn := range map[string]http.HandlerFunc{
		"/v1/organizations":      h.organizations,
		"/v1/organizations/{id}": h.organization,
		"/v1/projects/{id}":      h.project,
		"/v1/assets":             h.assets,
		"/v1/agents/{id}":        h.agent,
		"/v1/workflows/{id}":     h.workflow,
		"/v1/workflow-runs/{id}": h.workflowRun,
		"/v1/deployments/{id}":   h.deployment,
		"/v1/events":             h.events,
		"/v1/webhooks":           h.webhooks,
	} {
		authed.HandleFunc(path, fn).Methods(http.MethodGet)
	}
	authed.HandleFunc("/api/v1/workflows/runs", h.startRun).Methods(http.MethodPost)
}

type handlers struct{ s Services }

// query reads and validates query parameters, collecting every problem for one 400 answer.
type query struct {
	v   url.Values
	bad []string
}

func newQuery(r *http.Request) *query { return &query{v: r.URL.Query()} }

func (q *query) str(name string) string { return strings.TrimSpace(q.v.Get(name)) }

func (q *query) required(name string) string {
	s := q.str(name)
	if s == "" {
		q.bad = append(q.bad, name+" is required")
	}
	return s
}

// intRange returns the integer parameter name, def when absent; outside min..max it is an error.
func (q *query) intRange(name string, def, min, max int) int {
	s := q.str(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < min || n > max {
		q.bad = append(q.bad, fmt.Sprintf("%s must be an integer from %d to %d", name, min, max))
		return def
	}
	return n
}

func (q *query) float(name string) *float64 {
	s := q.str(name)
	if s == "" {
		return nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		q.bad = append(q.bad, name+" must be a number")
		return nil
	}
	return &f
}

func (q *query) time(name string) time.Time {
	s := q.str(name)
	if s == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		q.bad = append(q.bad, name+" must be an ISO 8601 timestamp such as 2024-05-01T12:00:00Z")
		return time.Time{}
	}
	return t.UTC()
}

// list returns a repeatable, comma-separable parameter: ?badges=HIPAA&badges=SOC%202 or
// ?badges=HIPAA,SOC%202.
func (q *query) list(name string) []string {
	var out []string
	for _, v := range q.v[name] {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

func (q *query) err() error {
	if len(q.bad) == 0 {
		return nil
	}
	return fault.Invalid("invalid query parameters: %s", strings.Join(q.bad, "; "))
}

// decodeJSON reads a JSON object body into v: 415 for another content type, 400 for malformed
// JSON, 413 (through LimitBody) for a body over the limit.
func decodeJSON(r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return fault.New(fault.KindUnsupportedMedia, "send the body as application/json")
		}
	}
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(v); err != nil {
		if fault.KindOf(err) != fault.KindInternal || isMaxBytes(err) {
			return err
		}
		return fault.Invalid("the body must be a JSON object: %v", err)
	}
	return nil
}

func isMaxBytes(err error) bool {
	var mbe *http.MaxBytesError
	return errors.As(err, &mbe)
}

func serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	b, err := schemas.OpenAPI.ReadFile("openapi/openapi.json")
	if err != nil {
		WriteError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	w.Write(b)
}

func validation(fields map[string]string) error {
	return fault.Validation("invalid request body", fields)
}
