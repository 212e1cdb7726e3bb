package auth

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"carehub/kernel/access"
	"carehub/storage"
)

// recordingSink keeps the records published to it.
type recordingSink struct {
	mu   sync.Mutex
	recs []storage.AuditRecord
}

func (s *recordingSink) Publish(rec storage.AuditRecord) {
	s.mu.Lock()
	s.recs = append(s.recs, rec)
	s.mu.Unlock()
}

func (s *recordingSink) PublishSync(_ context.Context, rec storage.AuditRecord) error {
	s.Publish(rec)
	return nil
}

func (s *recordingSink) last(t *testing.T) storage.AuditRecord {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.recs) == 0 {
		t.Fatal("no audit record")
	}
	return s.recs[len(s.recs)-1]
}

// TestGraphQLOperationFromHandler: the audit record of a live GraphQL call carries the name the
// GraphQL handler gave it from its own parse (SetGraphQLOperation); a call the handler did not
// name is named from the body, as before; a body that is a GraphQL document, a GET's query
// string and a call of another path are named as ever, whatever the handler says.
func TestGraphQLOperationFromHandler(t *testing.T) {
	sink := &recordingSink{}
	aud := NewAuditor(sink, AuditorConfig{})
	live := &access.Principal{OrgID: "org_1", KeyID: "key_1", Mode: access.Live}
	serve := func(principal *access.Principal, method, path, contentType, body, named string) storage.AuditRecord {
		t.Helper()
		h := aud.Middleware(nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got, _ := io.ReadAll(r.Body)
			if string(got) != body {
				t.Errorf("the handler read %q, want %q", got, body)
			}
			if named != "" {
				SetGraphQLOperation(r.Context(), named)
			}
			w.Write([]byte(`{"data":{}}`))
		}))
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req := httptest.NewRequest(method, path, rd)
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		req = req.WithContext(access.With(req.Context(), principal))
		h.ServeHTTP(httptest.NewRecorder(), req)
		return sink.last(t)
	}
	for _, tc := range []struct {
		method, path, contentType, body, named, want string
	}{
		{"POST", "/graphql", "application/json", `{"query":"{ patient(id: \"p\") { id } }"}`, "graphql query fromHandler", "graphql query fromHandler"},
		{"POST", "/graphql", "application/json", `{"query":"{ patient(id: \"p\") { id } }"}`, "", "graphql query patient"},
		{"POST", "/graphql", "application/json", `[{"query":"{ a }"}]`, "", "graphql batch"},
		{"POST", "/graphql", "application/json", `{"query":"{ a "}`, "", unparsedOperation},
		{"POST", "/graphql", "application/graphql", `mutation { runAgent { id } }`, "graphql query fromHandler", "graphql mutation runAgent"},
		{"GET", "/graphql?query=%7B%20organizations%20%7B%20id%20%7D%20%7D", "", "", "graphql query fromHandler", "graphql query organizations"},
		{"POST", "/v1/other", "application/json", `{"query":"{ a }"}`, "graphql query fromHandler", "POST unmatched"},
	} {
		if rec := serve(live, tc.method, tc.path, tc.contentType, tc.body, tc.named); rec.Operation != tc.want {
			t.Errorf("%s %s %s (handler: %q): recorded as %q, want %q", tc.method, tc.path, tc.body, tc.named, rec.Operation, tc.want)
		}
	}

	// Outside the middleware, SetGraphQLOperation does nothing.
	SetGraphQLOperation(context.Background(), "graphql query x")
}

// BenchmarkGraphQLOperation measures naming a document the parse cache holds (the idempotency
// middleware's mutation test, the audit's naming of a body the handler did not name).
//
//	go test ./api/auth -run '^$' -bench GraphQLOperation
func BenchmarkGraphQLOperation(b *testing.B) {
	q := `mutation($type: String!, $payload: JSON!, $projectId: ID!) {
		publishEvent(type: $type, payload: $payload, projectId: $projectId) { id timestamp } }`
	for b.Loop() {
		if GraphQLOperation(q, "") != "graphql mutation publishEvent" {
			b.Fatal("misnamed")
		}
	}
}
