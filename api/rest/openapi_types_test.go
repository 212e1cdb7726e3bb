package rest_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"carehub/api/auth"
	"carehub/api/rest"
	"carehub/ingest/intake"
	"carehub/kernel/apikeys"
	"carehub/kernel/events"
	"carehub/processors/deployments"
	"carehub/processors/marketplace"
	"carehub/processors/webhooks"
	"carehub/storage"
)

// jsonFields returns the JSON member names of struct type t, embedded structs flattened.
func jsonFields(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || !f.IsExported() && !f.Anonymous:
		case f.Anonymous && name == "":
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			out = append(out, jsonFields(ft)...)
		case name == "":
			out = append(out, f.Name)
		default:
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// TestOpenAPITypes checks the document against the Go types both ways: each schema names
// exactly the JSON members of the type that is encoded or decoded for it, so a field added to
// a response or a request cannot go undocumented, and a documented one cannot be missing.
func TestOpenAPITypes(t *testing.T) {
	doc, ops := loadOpenAPI(t)
	schemas := map[string]any{
		"Organization": rest.Organization{}, "Project": rest.Project{}, "Publisher": rest.Publisher{},
		"Pricing": rest.Pricing{}, "ComplianceScore": rest.ComplianceScore{}, "Asset": rest.Asset{},
		"Event": rest.Event{}, "Webhook": rest.Webhook{}, "Agent": rest.Agent{}, "Workflow": rest.Workflow{},
		"WorkflowRun": rest.WorkflowRun{}, "StartRunRequest": rest.StartRunRequest{}, "Deployment": rest.Deployment{},
		"EventType": events.EventType{}, "ApiKey": apikeys.Key{}, "CreatedApiKey": apikeys.CreatedKey{},
		"Token": auth.IssuedToken{}, "JWKS": auth.JWKSet{}, "AuditRecord": storage.AuditRecord{},
		"IngestResult": intake.Answer{}, "WebhookTestRequest": webhooks.TestRequest{},
		"InvokeRequest": deployments.InvokeRequest{}, "InvokeResult": deployments.InvokeResult{},
		"WebhookDelivery": webhooks.Delivery{}, "WebhookAttempt": webhooks.Attempt{},
		"PublishEventRequest": rest.PublishEventRequest{}, "PublishedEvents": rest.PublishedEvents{},
		"ModelArtifact": marketplace.ModelArtifact{}, "TensorSpec": marketplace.TensorSpec{},
		"ModelTensor": deployments.ModelTensor{}, "Prediction": deployments.Prediction{}, "InferenceBackend": deployments.Backend{},
	}
	for name, v := range schemas {
		s, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("openapi.json has no schema %s", name)
			continue
		}
		compare(t, "schema "+name, doc.properties(s), v)
	}
	for _, op := range ops {
		if v, ok := rest.RequestBodies[op.Method+" "+op.Path]; ok {
			s, _ := doc.jsonBody(op)
			compare(t, op.Method+" "+op.Path+" request body", doc.properties(s), v)
		}
	}
}

func compare(t *testing.T, what string, documented []string, v any) {
	t.Helper()
	encoded := jsonFields(reflect.TypeOf(v))
	for _, f := range encoded {
		if !slices.Contains(documented, f) {
			t.Errorf("%s: %T has %q, which the document does not describe", what, v, f)
		}
	}
	for _, f := range documented {
		if !slices.Contains(encoded, f) {
			t.Errorf("%s: the document describes %q, which %T does not have", what, f, v)
		}
	}
}

// TestOpenAPIResponses checks that every operation documents the answers every route of its
// kind can give: 400 (strict input applies to all), and for an authenticated one 401, 403 (a
// scope, an IP allowlist), 429 and 503 (the key store), for one with a body 413, 415 and 422, for
// one on a resource 404. Every error answer is the error envelope.
func TestOpenAPIResponses(t *testing.T) {
	_, ops := loadOpenAPI(t)
	for _, op := range ops {
		want := []string{"400"}
		if op.Security == nil || len(*op.Security) > 0 {
			want = append(want, "401", "403", "429", "503")
		}
		if op.RequestBody != nil {
			want = append(want, "413", "415", "422")
		}
		if strings.Contains(op.Path, "{") {
			want = append(want, "404")
		}
		for _, code := range want {
			if _, ok := op.Responses[code]; !ok {
				t.Errorf("%s %s does not document %s", op.Method, op.Path, code)
			}
		}
		for code, r := range op.Responses {
			switch {
			case code[0] == '2':
			case code == "500" || code[0] != '4' && code != "503":
				t.Errorf("%s %s documents %s: carehub answers no 5xx but 503", op.Method, op.Path, code)
			case !strings.HasPrefix(r.Ref, "#/components/responses/"):
				t.Errorf("%s %s: %s is not one of components/responses (the error envelope)", op.Method, op.Path, code)
			}
		}
	}
}
