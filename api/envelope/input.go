package envelope

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/gorilla/mux"

	"carehub/kernel/fault"
	"carehub/kernel/jsonwire"
	"carehub/schemas"
)

// Strict input at the edge (DECISIONS §3): what no route accepts is refused before it reaches a
// service, as 400 INVALID_REQUEST naming the parameter or field, instead of being dropped
// silently or reaching Postgres (which refuses NUL in text: SQLSTATE 22021, a 500).

// invalidField is a 400 INVALID_REQUEST naming the query parameter, path variable or body field
// at fault in its message and in details.field.
func invalidField(field, format string, args ...any) *fault.Error {
	return &fault.Error{Kind: fault.KindInvalid, Message: field + ": " + fmt.Sprintf(format, args...),
		Details: map[string]any{"field": field}}
}

// badText says what is wrong with s as text for Postgres and clients, or "".
func badText(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "contains a NUL character"
	}
	return ""
}

// StrictInput is the router middleware that checks the parts of a request every route shares:
// the query string must parse (url.ParseQuery), path variables and query parameters (names and
// values) must be UTF-8 without NUL, and a route the OpenAPI document describes takes only the
// query parameters the document declares for it. Each is 400 INVALID_REQUEST naming the
// parameter, written by write (WriteError, or the error form of the API the path belongs to).
// Bodies are checked where they are decoded (DecodeJSON, readFHIRBody).
func StrictInput(write func(http.ResponseWriter, *http.Request, error)) mux.MiddlewareFunc {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := CheckRequest(r); err != nil {
				write(w, r, err)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// CheckRequest is StrictInput's check of one request: nil, or the 400 naming the parameter.
func CheckRequest(r *http.Request) error {
	vars := mux.Vars(r)
	for _, name := range slices.Sorted(maps.Keys(vars)) {
		if msg := badText(vars[name]); msg != "" {
			return invalidField(name, "%s", msg)
		}
	}
	values, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return fault.Invalid("malformed query string: %v", queryError(err))
	}
	declared, documented := documentedQuery(r)
	for _, name := range slices.Sorted(maps.Keys(values)) {
		if msg := badText(name); msg != "" {
			return invalidField(strconv.QuoteToASCII(name), "parameter name %s", msg)
		}
		for _, v := range values[name] {
			if msg := badText(v); msg != "" {
				return invalidField(name, "%s", msg)
			}
		}
		if documented && !declared[name] {
			return unknownParameter(name, declared)
		}
	}
	return nil
}

// queryError is url.ParseQuery's error without the escaped text it quotes: that text is the
// client's own input, possibly invalid UTF-8 that the JSON answer could not carry faithfully.
func queryError(err error) string {
	var esc url.EscapeError
	if errors.As(err, &esc) {
		return "invalid percent-encoding (use %XX with two hexadecimal digits, and %25 for a literal %)"
	}
	return "a parameter contains a semicolon (separate parameters with &)"
}

func unknownParameter(name string, declared map[string]bool) error {
	if len(declared) == 0 {
		return invalidField(name, "unknown query parameter: this route takes none")
	}
	return invalidField(name, "unknown query parameter: this route takes %s", strings.Join(slices.Sorted(maps.Keys(declared)), ", "))
}

// documentedQuery returns the query parameters the OpenAPI document declares for r's route and
// method, and whether the document describes that operation at all (/graphql and the probes are
// not REST and are not described).
func documentedQuery(r *http.Request) (map[string]bool, bool) {
	route := mux.CurrentRoute(r)
	if route == nil {
		return nil, false
	}
	tmpl, err := route.GetPathTemplate()
	if err != nil {
		return nil, false
	}
	ops := openAPIQuery()
	declared, ok := ops[r.Method+" "+tmpl]
	return declared, ok
}

// openAPIQuery indexes the query parameters of every operation of schemas/openapi/openapi.json
// by "METHOD /path/template".
var openAPIQuery = sync.OnceValue(func() map[string]map[string]bool {
	raw, err := schemas.OpenAPI.ReadFile("openapi/openapi.json")
	if err != nil {
		panic(err) // embedded at build time
	}
	type param struct {
		Ref  string `json:"$ref"`
		Name string `json:"name"`
		In   string `json:"in"`
	}
	var doc struct {
		Paths      map[string]map[string]json.RawMessage `json:"paths"`
		Components struct {
			Parameters map[string]param `json:"parameters"`
		} `json:"components"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		panic(fmt.Sprintf("openapi.json: %v", err))
	}
	resolve := func(p param) param {
		if name, ok := strings.CutPrefix(p.Ref, "#/components/parameters/"); ok {
			return doc.Components.Parameters[name]
		}
		return p
	}
	out := map[string]map[string]bool{}
	for path, item := range doc.Paths {
		var shared []param
		if b, ok := item["parameters"]; ok {
			_ = json.Unmarshal(b, &shared)
		}
		for method, b := range item {
			if method == "parameters" {
				continue
			}
			var op struct {
				Parameters []param `json:"parameters"`
			}
			_ = json.Unmarshal(b, &op)
			names := map[string]bool{}
			for _, p := range append(slices.Clone(shared), op.Parameters...) {
				if p = resolve(p); p.In == "query" {
					names[p.Name] = true
				}
			}
			out[strings.ToUpper(method)+" "+path] = names
		}
	}
	return out
})

// DecodeJSON reads the JSON object body of r into v, strictly: 415 UNSUPPORTED_MEDIA_TYPE for a
// Content-Type other than application/json; 413 past the body limit; 400 INVALID_REQUEST, naming
// the field where there is one, for an empty or malformed body or one that is not an object,
// a member that is null (no field of a request body is nullable: leave it out), invalid UTF-8, a NUL character
// in any string or name, a field v does not declare, a value of the wrong type, or anything after
// the object. Objects that v holds as json.RawMessage or maps (input, payload, vitals) are open:
// any names, checked for NUL like the rest.
func DecodeJSON(r *http.Request, v any) error {
	b, err := ReadJSON(r)
	if err != nil {
		return err
	}
	return DecodeObject(b, v)
}

// ReadJSON reads r's body as DecodeJSON does and returns it, checked to be a non-empty JSON
// text of valid UTF-8 without NUL (not yet checked to be well-formed).
func ReadJSON(r *http.Request) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return nil, fault.New(fault.KindUnsupportedMedia, "Content-Type must be application/json")
		}
	}
	if r.Body == nil {
		return nil, fault.Invalid("the request body is empty: send a JSON object")
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		if isMaxBytes(err) {
			return nil, err
		}
		return nil, fault.Invalid("the request body could not be read")
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, fault.Invalid("the request body is empty: send a JSON object")
	}
	if err := CheckJSONText(b); err != nil {
		return nil, err
	}
	return b, nil
}

// DecodeObject decodes the JSON text b, which must be one object, into v, strictly (DecodeJSON).
func DecodeObject(b []byte, v any) error {
	if text := bytes.TrimSpace(b); len(text) == 0 || text[0] != '{' {
		return fault.Invalid("the request body must be a JSON object")
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(b, &members); err != nil {
		return JSONError(err)
	}
	for _, name := range slices.Sorted(maps.Keys(members)) {
		if string(members[name]) == "null" {
			return invalidField(name, "must not be null: leave the field out instead")
		}
	}
	err := decodeStrict(b, v)
	var typ *json.UnmarshalTypeError
	if errors.As(err, &typ) && strings.HasPrefix(typ.Value, "number ") {
		// JSON Schema's integer is any number without a fraction: 280.0 and 2.8e2 are integers
		// (the OpenAPI document promises as much), which encoding/json refuses for an int field.
		if whole, ok := integralNumbers(b); ok {
			err = decodeStrict(whole, v)
		}
	}
	if err != nil && fault.As(err) == nil {
		return JSONError(err)
	}
	return err
}

// decodeStrict decodes the one JSON object b into v, refusing unknown fields and trailing data.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fault.Invalid("malformed JSON body: data after the JSON object")
	}
	return nil
}

// integralNumbers rewrites b with every number that has no fraction (280.0, 2.8e2) written as an
// integer; ok is false when there is none to rewrite.
func integralNumbers(b []byte) (_ []byte, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var doc any
	if dec.Decode(&doc) != nil {
		return nil, false
	}
	var walk func(any) any
	walk = func(x any) any {
		switch x := x.(type) {
		case map[string]any:
			for k, e := range x {
				x[k] = walk(e)
			}
		case []any:
			for i, e := range x {
				x[i] = walk(e)
			}
		case json.Number:
			if _, err := x.Int64(); err == nil {
				return x
			}
			if f, err := x.Float64(); err == nil && f == math.Trunc(f) && math.Abs(f) < 1<<53 {
				ok = true
				return json.Number(strconv.FormatInt(int64(f), 10))
			}
		}
		return x
	}
	doc = walk(doc)
	if !ok {
		return nil, false
	}
	out, err := json.Marshal(doc)
	return out, err == nil
}

// CheckJSONText refuses, as 400 naming the field, a JSON text that is not valid UTF-8, carries
// a NUL character (\u0000) in a string or a member name, or holds anything else the stores
// cannot hold as it stands (jsonwire.Storable: a number that is no finite double, an unpaired
// surrogate escape, nesting past 128). Any body may end up in an event or a jsonb column, and
// an event the log cannot store used to stop the log for every tenant. A text that is not JSON
// at all passes: the caller's decoder says what is wrong with it.
func CheckJSONText(b []byte) error {
	if !utf8.Valid(b) {
		return fault.Invalid("the request body is not valid UTF-8")
	}
	if bytes.Contains(b, []byte(`\u0000`)) { // the only way a NUL can appear in valid JSON
		if err := checkNUL(b); err != nil {
			return err
		}
	}
	var se *jsonwire.StorableError
	if err := jsonwire.Storable(b); errors.As(err, &se) {
		if se.Path == "" {
			return fault.Invalid("the request body %s", se.Reason)
		}
		return invalidField(se.Path, "%s", se.Reason)
	}
	return nil
}

// checkNUL refuses, naming the field, the JSON text b with a NUL in a string or member name.
func checkNUL(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var doc any
	if dec.Decode(&doc) != nil {
		return nil
	}
	if field, ok := nulField(doc, ""); ok {
		if field == "" {
			field = "body"
		}
		return invalidField(field, "contains a NUL character")
	}
	return nil
}

// nulField returns the path (a.b[2].c) of the first string or member name in v holding a NUL.
func nulField(v any, path string) (string, bool) {
	switch x := v.(type) {
	case string:
		return path, strings.IndexByte(x, 0) >= 0
	case []any:
		for i, e := range x {
			if f, ok := nulField(e, fmt.Sprintf("%s[%d]", path, i)); ok {
				return f, true
			}
		}
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			p := k
			if path != "" {
				p = path + "." + k
			}
			if strings.IndexByte(k, 0) >= 0 {
				return strconv.QuoteToASCII(p), true
			}
			if f, ok := nulField(x[k], p); ok {
				return f, true
			}
		}
	}
	return "", false
}

func isMaxBytes(err error) bool {
	var mbe *http.MaxBytesError
	return errors.As(err, &mbe)
}

// JSONError turns an encoding/json decode error into a 400 naming the field.
func JSONError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case isMaxBytes(err):
		return err
	case errors.As(err, &syn):
		return fault.Invalid("malformed JSON body at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ) && typ.Field != "":
		return invalidField(typ.Field, "must be %s, not a JSON %s", jsonKind(typ.Type.Kind().String()), typ.Value)
	case errors.As(err, &typ):
		return fault.Invalid("the request body must be a JSON object, not a JSON %s", typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fault.Invalid("malformed JSON body: it ends before the object does")
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name, _ = strconv.Unquote(name)
		return invalidField(name, "unknown field")
	}
	return fault.Invalid("malformed JSON body: %v", err)
}

// jsonKind names a Go kind as the JSON type a client sends for it.
func jsonKind(k string) string {
	switch k {
	case "string":
		return "a string"
	case "slice", "array":
		return "an array"
	case "map", "struct":
		return "an object"
	case "bool":
		return "a boolean"
	case "float32", "float64":
		return "a number"
	}
	if strings.HasPrefix(k, "int") || strings.HasPrefix(k, "uint") {
		return "an integer"
	}
	return "another type"
}

// MethodNotAllowed is router's MethodNotAllowedHandler: 405 METHOD_NOT_ALLOWED with an Allow
// header listing the methods the request's path is served with, found by matching the request
// against router's own routes with each method.
func MethodNotAllowed(router *mux.Router) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		allowed := AllowedMethods(router, r)
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		WriteJSON(w, http.StatusMethodNotAllowed, ErrorBody{Error: ErrorObject{Code: CodeMethodNotAllowed,
			Message:   fmt.Sprintf("%s is not allowed on this path; allowed: %s", r.Method, strings.Join(allowed, ", ")),
			RequestID: RequestID(r.Context()), DocsURL: DocsURL(r, CodeMethodNotAllowed)}})
	})
}

// probeMethods are the methods AllowedMethods tries.
var probeMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodOptions}

// AllowedMethods returns the methods router serves r's path with.
func AllowedMethods(router *mux.Router, r *http.Request) []string {
	var out []string
	for _, m := range probeMethods {
		probe := r.Clone(r.Context())
		probe.Method = m
		var match mux.RouteMatch
		if router.Match(probe, &match) && match.MatchErr == nil {
			out = append(out, m)
		}
	}
	return out
}
