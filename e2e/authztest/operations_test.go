package authztest

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/gorilla/mux"

	"carehub/api/auth"
	"carehub/api/graphql/spectest"
	"carehub/api/rest"
	"carehub/processors/audit"
	"carehub/schemas"
)

// graphQLOperations returns every root field of the schema as "query f", "mutation f" and
// "subscription f", with the field's description.
func graphQLOperations(t *testing.T) map[string]string {
	t.Helper()
	res, err := spectest.IntrospectSDL(schemas.GraphQL)
	if err != nil {
		t.Fatalf("introspect schemas.GraphQL: %v", err)
	}
	ops := map[string]string{}
	for _, root := range []string{"Query", "Mutation", "Subscription"} {
		typ := res.Type(root)
		if typ == nil {
			t.Fatalf("schema has no %s type", root)
		}
		for _, f := range typ.Fields {
			ops[strings.ToLower(root)+" "+f.Name] = f.Description
		}
	}
	return ops
}

// restOperations returns every REST operation as "METHOD /template": the routes the REST and
// auth packages mount (walked on routers of their own), and every path of the OpenAPI document.
// public reports those mounted without authentication.
func restOperations(t *testing.T) (ops map[string]bool, public map[string]bool) {
	t.Helper()
	pub, authed := mux.NewRouter(), mux.NewRouter()
	rest.Mount(pub, authed, rest.Services{})
	rest.PatientRoutes(authed, nil)
	rest.InvokeRoutes(authed, nil)
	rest.ModelRoutes(authed, nil)
	rest.WebhookRoutes(authed, nil)
	rest.ObservationIngestRoutes(authed, nil)
	h := auth.NewHandlers(nil, nil, audit.NewService(nil))
	h.Routes(authed)
	h.PublicRoutes(pub)
	ops, public = map[string]bool{}, map[string]bool{}
	walk := func(r *mux.Router, isPublic bool) {
		err := r.Walk(func(route *mux.Route, _ *mux.Router, _ []*mux.Route) error {
			tpl, err := route.GetPathTemplate()
			if err != nil {
				return nil
			}
			methods, _ := route.GetMethods()
			for _, m := range methods {
				ops[m+" "+tpl] = true
				if isPublic {
					public[m+" "+tpl] = true
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	walk(pub, true)
	walk(authed, false)

	b, err := schemas.OpenAPI.ReadFile("openapi/openapi.json")
	if err != nil {
		t.Fatalf("read the OpenAPI document: %v", err)
	}
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("parse the OpenAPI document: %v", err)
	}
	for path, item := range doc.Paths {
		for method := range item {
			m := strings.ToUpper(method)
			if slices.Contains([]string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}, m) {
				ops[m+" "+path] = true
			}
		}
	}
	return ops, public
}

// TestMatrixCoversEveryOperation fails for an operation without a row, a row for an operation
// that does not exist, and a GraphQL row whose scope disagrees with the schema's description.
func TestMatrixCoversEveryOperation(t *testing.T) {
	gqlOps := graphQLOperations(t)
	restOps, public := restOperations(t)
	byOp := map[string]row{}
	for _, r := range rows {
		if _, dup := byOp[r.op]; dup {
			t.Errorf("two rows for %s", r.op)
		}
		byOp[r.op] = r
	}
	for op := range gqlOps {
		if _, ok := byOp[op]; !ok {
			t.Errorf("GraphQL %s has no row in the authorization matrix", op)
		}
	}
	for op := range restOps {
		if _, ok := byOp[op]; !ok {
			t.Errorf("REST %s has no row in the authorization matrix", op)
		}
	}
	for op, r := range byOp {
		_, isGQL := gqlOps[op]
		switch {
		case strings.HasPrefix(op, "field "):
		case strings.Contains(op, " /fhir/R4"):
			// The FHIR base is described by its CapabilityStatement, not the OpenAPI document;
			// checkNodeRoutes holds its rows to the routes the node serves.
		case !isGQL && !restOps[op]:
			t.Errorf("row %s names no operation of the schema or the REST routes", op)
		case restOps[op] && public[op] != (r.access == public_):
			t.Errorf("row %s: public=%v, but the route is mounted public=%v", op, r.access == public_, public[op])
		}
		if desc, ok := gqlOps[op]; ok {
			checkDescription(t, op, desc, r)
		}
	}
}

// checkDescription holds a GraphQL row against what the schema tells clients it requires.
func checkDescription(t *testing.T, op, desc string, r row) {
	t.Helper()
	desc = strings.Join(strings.Fields(desc), " ")
	platformOnly := strings.Contains(desc, "Platform operator")
	if platformOnly != (r.access == platform) {
		t.Errorf("row %s: platform-only=%v, the schema's description says %q", op, r.access == platform, desc)
	}
	var stated []string
	if i := strings.Index(desc, "Requires "); i >= 0 {
		for _, w := range strings.FieldsFunc(desc[i+len("Requires "):], func(c rune) bool { return c == ' ' || c == ',' || c == '.' }) {
			if strings.Contains(w, ":") {
				stated = append(stated, w)
			} else if w != "and" {
				break
			}
		}
	}
	if !slices.Equal(stated, r.scopes) && !(len(stated) == 0 && len(r.scopes) == 0) {
		t.Errorf("row %s requires %v, the schema's description says %v (%q)", op, r.scopes, stated, desc)
	}
}
