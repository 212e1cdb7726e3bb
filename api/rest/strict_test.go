package rest_test

import (
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"

	"carehub/e2e/servertest"
	"carehub/schemas"
)

// openAPI is the part of schemas/openapi/openapi.json these tests read, with $refs resolved.
type openAPI struct {
	Paths      map[string]map[string]json.RawMessage `json:"paths"`
	Components struct {
		Parameters map[string]docParam  `json:"parameters"`
		Schemas    map[string]docSchema `json:"schemas"`
	} `json:"components"`
}

type docParam struct {
	Ref      string    `json:"$ref"`
	Name     string    `json:"name"`
	In       string    `json:"in"`
	Required bool      `json:"required"`
	Schema   docSchema `json:"schema"`
}

type docSchema struct {
	Ref                  string               `json:"$ref"`
	Type                 any                  `json:"type"`
	Format               string               `json:"format"`
	Enum                 []any                `json:"enum"`
	Properties           map[string]docSchema `json:"properties"`
	Required             []string             `json:"required"`
	AdditionalProperties any                  `json:"additionalProperties"`
	Items                *docSchema           `json:"items"`
	AllOf                []docSchema          `json:"allOf"`
}

type docOperation struct {
	Method      string
	Path        string
	Parameters  []docParam `json:"parameters"`
	RequestBody *struct {
		Content map[string]struct {
			Schema docSchema `json:"schema"`
		} `json:"content"`
	} `json:"requestBody"`
	Responses map[string]struct {
		Ref     string `json:"$ref"`
		Content map[string]struct {
			Schema docSchema `json:"schema"`
		} `json:"content"`
	} `json:"responses"`
	Security *[]map[string][]string `json:"security"`
}

func loadOpenAPI(t *testing.T) (*openAPI, []docOperation) {
	t.Helper()
	raw, err := schemas.OpenAPI.ReadFile("openapi/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPI
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var ops []docOperation
	for path, item := range doc.Paths {
		for method, b := range item {
			if method == "parameters" {
				t.Fatalf("%s: path-level parameters: declare them on each operation", path)
			}
			op := docOperation{Method: strings.ToUpper(method), Path: path}
			if err := json.Unmarshal(b, &op); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			for i, p := range op.Parameters {
				if name, ok := strings.CutPrefix(p.Ref, "#/components/parameters/"); ok {
					op.Parameters[i] = doc.Components.Parameters[name]
				}
			}
			ops = append(ops, op)
		}
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i].Path+ops[i].Method < ops[j].Path+ops[j].Method })
	return &doc, ops
}

// resolve follows a schema's $ref.
func (d *openAPI) resolve(s docSchema) docSchema {
	if name, ok := strings.CutPrefix(s.Ref, "#/components/schemas/"); ok {
		return d.Components.Schemas[name]
	}
	return s
}

// properties returns the member names schema s describes, through $ref and allOf.
func (d *openAPI) properties(s docSchema) []string {
	s = d.resolve(s)
	names := slices.Collect(maps.Keys(s.Properties))
	for _, part := range s.AllOf {
		names = append(names, d.properties(part)...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// jsonBody returns the application/json request body schema of op, if it takes one.
func (d *openAPI) jsonBody(op docOperation) (docSchema, bool) {
	if op.RequestBody == nil {
		return docSchema{}, false
	}
	c, ok := op.RequestBody.Content["application/json"]
	if !ok {
		return docSchema{}, false
	}
	return d.resolve(c.Schema), true
}

// fillPath puts value in every path parameter of op.Path, and the other parameters' names.
func fillPath(path, value string) string {
	for {
		i := strings.IndexByte(path, '{')
		if i < 0 {
			return path
		}
		j := strings.IndexByte(path[i:], '}')
		path = path[:i] + value + path[i+j+1:]
	}
}

// wantInvalid checks a 400 INVALID_REQUEST naming field (none when field is "").
func wantInvalid(t *testing.T, what string, r *servertest.Response, field string) {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal(r.Body, &e); err != nil || r.Status != http.StatusBadRequest || e.Error.Code != "INVALID_REQUEST" {
		t.Errorf("%s: want 400 INVALID_REQUEST, got %d %s", what, r.Status, r.Body)
		return
	}
	if field != "" && (e.Error.Details["field"] != field || !strings.Contains(e.Error.Message, field)) {
		t.Errorf("%s: the answer does not name %q: %s", what, field, r.Body)
	}
}

// TestStrictInput sends every operation of the OpenAPI document the hostile and careless input
// DECISIONS §3 refuses, and wants 400 INVALID_REQUEST naming the parameter or field for each
// (not a 500 from Postgres, not a silent drop), and 405 with Allow for undeclared methods.
func TestStrictInput(t *testing.T) {
	s := servertest.Start(t)
	doc, ops := loadOpenAPI(t)
	methods := map[string][]string{}
	for _, op := range ops {
		methods[op.Path] = append(methods[op.Path], op.Method)
	}

	for _, op := range ops {
		t.Run(op.Method+" "+op.Path, func(t *testing.T) {
			// A key per operation: one key's rate limit (burst 100) would refuse the later
			// operations' requests before their input is checked.
			key := s.DemoKey()
			path := fillPath(op.Path, "x")
			do := func(method, target string, body any) *servertest.Response {
				return s.Do(method, target, key, body)
			}
			var body any
			if op.RequestBody != nil {
				body = map[string]any{}
			}
			for _, p := range op.Parameters {
				switch p.In {
				case "path":
					for _, bad := range []string{"pat_%00", "pat_%FF"} {
						target := strings.Replace(op.Path, "{"+p.Name+"}", bad, 1)
						wantInvalid(t, "path "+bad, do(op.Method, fillPath(target, "x"), body), p.Name)
					}
				case "query":
					for _, bad := range []string{"a%00b", "a%FFb"} {
						wantInvalid(t, "query "+p.Name+"="+bad, do(op.Method, path+"?"+p.Name+"="+bad, body), p.Name)
					}
					sch := doc.resolve(p.Schema)
					if sch.Type == "integer" || sch.Type == "number" || sch.Format == "date-time" || len(sch.Enum) > 0 {
						wantInvalid(t, "empty "+p.Name, do(op.Method, path+"?"+p.Name+"=", body), "")
					}
				}
			}
			wantInvalid(t, "unknown query parameter", do(op.Method, path+"?bogus=1", body), "bogus")
			wantInvalid(t, "malformed query string", do(op.Method, path+"?cursor=%%%x", body), "")

			if schema, ok := doc.jsonBody(op); ok && schema.AdditionalProperties == false {
				wantInvalid(t, "unknown field", do(op.Method, path, `{"bogus": 1}`), "bogus")
				wantInvalid(t, "trailing data", do(op.Method, path, `{} {}`), "")
				wantInvalid(t, "not an object", do(op.Method, path, `[]`), "")
				wantInvalid(t, "invalid UTF-8", do(op.Method, path, "{\"x\": \"\xff\"}"), "")
				for _, name := range slices.Sorted(maps.Keys(schema.Properties)) {
					wantInvalid(t, "NUL in "+name, do(op.Method, path, `{"`+name+`": "a\u0000b"}`), name)
					wantInvalid(t, "null "+name, do(op.Method, path, `{"`+name+`": null}`), name)
				}
			}
			if op.RequestBody != nil && strings.HasPrefix(op.Path, "/v1/patients") {
				wantInvalid(t, "NUL in a FHIR resource", do(op.Method, path, `{"resourceType":"Patient","name":[{"family":"a\u0000"}]}`), "name[0].family")
			}

			// Every method this path is not served with is 405, with Allow naming the ones it is.
			want := slices.Sorted(slices.Values(methods[op.Path]))
			for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, "TRACE"} {
				if slices.Contains(want, m) {
					continue
				}
				r := do(m, path, nil)
				var e errorBody
				_ = json.Unmarshal(r.Body, &e)
				allow := strings.Split(r.Header.Get("Allow"), ", ")
				sort.Strings(allow)
				if r.Status != http.StatusMethodNotAllowed || e.Error.Code != "METHOD_NOT_ALLOWED" || !slices.Equal(allow, want) {
					t.Errorf("%s %s: want 405 METHOD_NOT_ALLOWED with Allow %v, got %d Allow %q %s", m, path, want, r.Status, r.Header.Get("Allow"), r.Body)
				}
			}
		})
	}
}
