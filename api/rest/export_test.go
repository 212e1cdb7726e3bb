package rest

// RequestBodies are the request types of this package that the OpenAPI document describes,
// by "METHOD path" (TestOpenAPITypes).
var RequestBodies = map[string]any{
	"POST /api/v1/workflows/runs":    StartRunRequest{},
	"POST /v1/webhooks":              createWebhookRequest{},
	"PATCH /v1/webhooks/{id}":        updateWebhookRequest{},
	"POST /v1/webhooks/{id}/recover": recoverRequest{},
}
