package graphql

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"carehub/api/auth"
	"carehub/kernel/access"
	"carehub/storage"
)

// lastRecord is an audit sink that keeps the last record.
type lastRecord struct {
	mu  sync.Mutex
	rec storage.AuditRecord
}

func (s *lastRecord) Publish(rec storage.AuditRecord) {
	s.mu.Lock()
	s.rec = rec
	s.mu.Unlock()
}

func (s *lastRecord) PublishSync(_ context.Context, rec storage.AuditRecord) error {
	s.Publish(rec)
	return nil
}

// TestExecuteNamesTheAuditedOperation: Execute gives the audit record of the call the name of
// the operation it parsed (the body, which the auditor would otherwise read, names another here);
// a document that does not parse is "graphql unparsed"; one refused before it is parsed is
// left to the auditor, which names it from the body.
func TestExecuteNamesTheAuditedOperation(t *testing.T) {
	h, err := New(Services{}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	sink := &lastRecord{}
	aud := auth.NewAuditor(sink, auth.AuditorConfig{})
	live := &access.Principal{OrgID: "org_1", KeyID: "key_1", Mode: access.Live}
	for _, tc := range []struct {
		run  Request
		want string
	}{
		{Request{Query: `query A { __typename } query B { __schema { queryType { name } } }`, OperationName: "B"}, "graphql query __schema"},
		{Request{Query: `{ __typename }`}, "graphql query __typename"},
		{Request{Query: `{ __typename `}, "graphql unparsed"},
		{Request{Query: `query A { __typename }`, OperationName: "C"}, "graphql unparsed"},
		{Request{Query: `{ apiVersion }`, Variables: map[string]any{"x": "\x00"}}, "graphql query fromBody"}, // refused before parsing
		{Request{Query: " "}, "graphql query fromBody"},
	} {
		srv := aud.Middleware(nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.write(w, http.StatusOK, h.Execute(r.Context(), tc.run))
		}))
		req := httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader(`{"query":"{ fromBody }"}`))
		req.Header.Set("Content-Type", "application/json")
		srv.ServeHTTP(httptest.NewRecorder(), req.WithContext(access.With(req.Context(), live)))
		sink.mu.Lock()
		got := sink.rec.Operation
		sink.mu.Unlock()
		if got != tc.want {
			t.Errorf("%q (%q): recorded as %q, want %q", tc.run.Query, tc.run.OperationName, got, tc.want)
		}
	}
}
