// Package rest serves carehub's REST interface (/v1 and /api/v1): decoding, authorization through
// the services, and the response envelopes of the spec (package envelope writes them).
package rest

import (
	"context"
	"net/http"

	"github.com/gorilla/mux"

	"carehub/api/envelope"
	"carehub/kernel/fault"
	"carehub/processors/agents"
	"carehub/processors/deployments"
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
//	GET  /v1/organizations/{id}        one organization, by id or slug
//	GET  /v1/projects                  projects, of one organization (id or slug) or all visible, cursor-paginated
//	GET  /v1/projects/{id}             one project
//	GET  /v1/assets                    marketplace assets, filtered, cursor-paginated
//	GET  /v1/agents/{id}               one agent
//	GET  /v1/workflows/{id}            one workflow
//	GET  /v1/workflow-runs/{id}        one workflow run
//	GET  /v1/deployments/{id}          one deployment
//	GET  /v1/events                    a project's events, filtered, either order, cursor-paginated
//	GET  /v1/events/export             the same events streamed as NDJSON or CSV (gzip), resumable
//	GET  /v1/events/stats              event counts per bucket and group, rates, top-N, percentiles
//	POST /v1/events                    publish one event or an array of up to 1,000, all or nothing
//	GET  /v1/webhooks                  a project's webhook subscriptions, secrets masked
//	POST /api/v1/workflows/runs        start a workflow run (trigger "event")
func Mount(public, authed *mux.Router, s Services) {
	h := &handlers{s}
	public.HandleFunc("/v1/openapi.json", serveOpenAPI).Methods(http.MethodGet)
	public.HandleFunc("/v1/event-types", serveEventTypes).Methods(http.MethodGet)
	for path, fn := range map[string]http.HandlerFunc{
		"/v1/organizations":      h.organizations,
		"/v1/organizations/{id}": h.organization,
		"/v1/projects":           h.projects,
		"/v1/projects/{id}":      h.project,
		"/v1/assets":             h.assets,
		"/v1/agents/{id}":        h.agent,
		"/v1/workflows/{id}":     h.workflow,
		"/v1/workflow-runs/{id}": h.workflowRun,
		"/v1/deployments/{id}":   h.deployment,
		"/v1/events":             h.events,
		"/v1/events/export":      h.exportEvents,
		"/v1/events/stats":       h.eventStats,
		"/v1/webhooks":           h.webhooks,
	} {
		authed.HandleFunc(path, fn).Methods(http.MethodGet)
	}
	authed.HandleFunc("/api/v1/workflows/runs", h.startRun).Methods(http.MethodPost)
	authed.HandleFunc("/v1/events", h.publishEvents).Methods(http.MethodPost)
}

type handlers struct{ s Services }

func serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	b, err := schemas.OpenAPI.ReadFile("openapi/openapi.json")
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	w.Write(b)
}

func validation(fields map[string]string) error {
	return fault.Validation("invalid request body", fields)
}
