package graphql

import (
	"context"
	"testing"
)

// Invalid UTF-8 cannot arrive in a JSON body (decoding replaces it), but Execute's other callers
// are held to the same rule as a NUL byte.
func TestInvalidUTF8(t *testing.T) {
	h, err := New(Services{}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		query       string
		vars        map[string]any
		ext, naming string
	}{
		{`query($id: ID!) { patient(id: $id) { id } }`, map[string]any{"id": "pat_\xff"}, "variable", "$id"},
		{`query($x: JSON!) { apiVersion }`, map[string]any{"x": []any{map[string]any{"a": "ok"}, map[string]any{"b\xc3": "ok"}}}, "variable", `$x[1]."b\xc3"`},
		{"{ patient(id: \"pat_\xff\") { id } }", nil, "argument", "patient(id)"},
	} {
		res := h.Execute(context.Background(), Request{Query: tc.query, Variables: tc.vars})
		if len(res.Errors) != 1 || res.Errors[0].Extensions["code"] != CodeBadUserInput || res.Errors[0].Extensions[tc.ext] != tc.naming {
			t.Errorf("%s %v: errors %+v, want one BAD_USER_INPUT naming %s %s", tc.query, tc.vars, res.Errors, tc.ext, tc.naming)
		}
	}
}
