package spectest

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	graphql "github.com/graph-gophers/graphql-go"
)

func TestIntroTypeRefString(t *testing.T) {
	name := func(s string) *string { return &s }
	named := func(s string) *IntroTypeRef { return &IntroTypeRef{Kind: "OBJECT", Name: name(s)} }
	nonNull := func(r *IntroTypeRef) *IntroTypeRef { return &IntroTypeRef{Kind: "NON_NULL", OfType: r} }
	list := func(r *IntroTypeRef) *IntroTypeRef { return &IntroTypeRef{Kind: "LIST", OfType: r} }
	for _, c := range []struct {
		ref  *IntroTypeRef
		want string
	}{
		{named("Event"), "Event"},
		{nonNull(named("Event")), "Event!"},
		{list(named("Event")), "[Event]"},
		{list(nonNull(named("Event"))), "[Event!]"},
		{nonNull(list(nonNull(named("Event")))), "[Event!]!"},
		{nonNull(list(list(named("Event")))), "[[Event]]!"},
	} {
		if got := c.ref.String(); got != c.want {
			t.Errorf("String() = %s, want %s", got, c.want)
		}
	}
}

// sdlIntrospectionJSON is graphql-go's introspection of the schema: the data object alone.
func sdlIntrospectionJSON(t *testing.T) []byte {
	t.Helper()
	b, err := graphql.MustParseSchema(schemaSDL(t), nil, graphql.UseStringDescriptions()).ToJSON()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseIntrospection(t *testing.T) {
	data := sdlIntrospectionJSON(t)
	spec := loadSpec(t)
	for _, c := range []struct {
		name    string
		body    string
		wantErr string
	}{
		{"data alone", string(data), ""},
		{"full response", `{"data":` + string(data) + `}`, ""},
		{"errors only", `{"data":null,"errors":[{"message":"introspection disabled"}]}`, "introspection disabled"},
		{"no schema", `{"data":{}}`, "no __schema"},
		{"empty schema", `{"data":{"__schema":{"types":[]}}}`, "lacks queryType or types"},
		{"not JSON", `<html>`, "parse introspection"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := ParseIntrospection([]byte(c.body))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want it to contain %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.QueryType == nil || r.QueryType.Name != "Query" || r.Type("WebhookSubscription") == nil {
				t.Fatalf("parsed schema lacks Query or WebhookSubscription")
			}
			if d := Compare(spec, r); len(d) != 0 {
				t.Fatalf("Compare = %q", d)
			}
		})
	}
}

// TestFetchIntrospection plays the live server: it checks the request a client sends and answers
// with the schema's introspection, as the lead's check against a running carehub does.
func TestFetchIntrospection(t *testing.T) {
	data := sdlIntrospectionJSON(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Query string `json:"query"`
		}
		switch {
		case r.Method != http.MethodPost || r.URL.Path != "/graphql":
			http.Error(w, "wrong route", http.StatusNotFound)
		case r.Header.Get("Authorization") != "Bearer chk_test_x":
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"errors":[{"message":"unauthenticated","extensions":{"code":"UNAUTHENTICATED"}}]}`))
		case r.Header.Get("Content-Type") != "application/json" || json.NewDecoder(r.Body).Decode(&req) != nil || req.Query != IntrospectionQuery:
			http.Error(w, "bad request", http.StatusBadRequest)
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"data":` + string(data) + `}`))
		}
	}))
	defer srv.Close()

	auth := http.Header{"Authorization": {"Bearer chk_test_x"}}
	r, err := FetchIntrospection(context.Background(), srv.Client(), srv.URL+"/graphql", auth)
	if err != nil {
		t.Fatal(err)
	}
	if d := Compare(loadSpec(t), r); len(d) != 0 {
		t.Fatalf("Compare = %q", d)
	}

	_, err = FetchIntrospection(context.Background(), srv.Client(), srv.URL+"/graphql", nil)
	if err == nil || !strings.Contains(err.Error(), "HTTP 401") {
		t.Fatalf("without credentials: error %v, want HTTP 401", err)
	}
}

func TestIntrospectSDLRejectsInvalidSchema(t *testing.T) {
	_, err := IntrospectSDL("type Query { a: Missing }")
	if err == nil {
		t.Fatal("IntrospectSDL accepted a schema with an undefined type")
	}
}
