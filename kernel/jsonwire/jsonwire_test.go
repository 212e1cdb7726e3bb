package jsonwire_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"reflect"
	"testing"
	"unicode/utf8"

	"carehub/kernel/jsonwire"
)

// FuzzMembers checks Valid and Members against encoding/json: Valid agrees with json.Valid, and
// the members of a valid object are the keys and raw values json.Unmarshal puts in a map (the
// last of repeated keys).
//
//	go test -run '^$' -fuzz FuzzMembers -fuzztime 60s ./kernel/jsonwire/
func FuzzMembers(f *testing.F) {
	for _, s := range []string{
		`{"a":1,"b":"x","c":{"d":[1,2,{"e":"}"}]},"f":null,"g":true,"h":-1.5e-7}`,
		` { "a" : "\"\\\u00e9\ud800" , "a":[ ] ,"\u0062":{} } `,
		"{\"k\xff\":\"v\xfe\"}",
		`{"a":"b\\"}`, `{"é\u0062":"é\t"}`, `{}`, `[]`, `"x"`, `1`, `null`, `{"a":}`, `{"a":1,}`, `{"a"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if jsonwire.Valid(b) != json.Valid(b) {
			t.Fatalf("Valid(%q) = %v, json.Valid: %v", b, jsonwire.Valid(b), json.Valid(b))
		}
		var want map[string]json.RawMessage
		if !json.Valid(b) || json.Unmarshal(b, &want) != nil || want == nil {
			return
		}
		got := map[string]json.RawMessage{}
		if err := jsonwire.Members(b, func(k, v []byte) error {
			got[string(k)] = append(json.RawMessage(nil), v...)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("Members(%q): %d members, encoding/json: %d", b, len(got), len(want))
		}
		for k, v := range want {
			if !bytes.Equal(got[k], v) {
				t.Fatalf("Members(%q)[%q] = %q, encoding/json: %q", b, k, got[k], v)
			}
		}
	})
}

// FuzzValues checks String, Float and Bool against json.Unmarshal of the same value into the
// same type, null and wrong types included.
func FuzzValues(f *testing.F) {
	for _, s := range []string{`"abc"`, `"a\"b\u00e9\ud83d\ude00"`, `"é\n\"x"`, `"ü\u00e9"`, "\"\xff\"", `null`, `1`, `-0.5e-3`, `1e400`, `true`, `false`, `"true"`, `{}`, `[1]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		if !json.Valid(v) {
			return
		}
		v = bytes.TrimSpace(v)
		s, ws := "before", "before"
		if err, werr := jsonwire.String(v, &s), json.Unmarshal(v, &ws); (err == nil) != (werr == nil) || s != ws {
			t.Fatalf("String(%q) = %q, %v; encoding/json: %q, %v", v, s, err, ws, werr)
		}
		x, wx := 1.0, 1.0
		if err, werr := jsonwire.Float(v, &x), json.Unmarshal(v, &wx); (err == nil) != (werr == nil) || err == nil && x != wx {
			t.Fatalf("Float(%q) = %v, %v; encoding/json: %v, %v", v, x, err, wx, werr)
		}
		y, wy := true, true
		if err, werr := jsonwire.Bool(v, &y), json.Unmarshal(v, &wy); (err == nil) != (werr == nil) || y != wy {
			t.Fatalf("Bool(%q) = %v, %v; encoding/json: %v, %v", v, y, err, wy, werr)
		}
	})
}

// FuzzAppend checks AppendString and AppendFloat against encoding/json: the string reads back
// as itself, and the number is the bytes json.Marshal writes.
func FuzzAppend(f *testing.F) {
	f.Add("monitor \"7\"\\\n\t\x01 é <&> \u2028", 72.25)
	f.Add("", 1e21)
	f.Add("x", -1.5e-7)
	f.Add("y", 1e-6)
	f.Fuzz(func(t *testing.T, s string, x float64) {
		if utf8.ValidString(s) {
			var back string
			if err := json.Unmarshal(jsonwire.AppendString(nil, s), &back); err != nil || back != s {
				t.Fatalf("AppendString(%q) = %s reads back as %q, %v", s, jsonwire.AppendString(nil, s), back, err)
			}
		}
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return
		}
		want, _ := json.Marshal(x)
		if got := jsonwire.AppendFloat(nil, x); !bytes.Equal(got, want) {
			t.Fatalf("AppendFloat(%v) = %s, encoding/json: %s", x, got, want)
		}
	})
}

// FuzzAppendCompact checks AppendCompact against json.Compact: both refuse the same input, and
// what both accept compacts to the same bytes, appended after what b held.
func FuzzAppendCompact(f *testing.F) {
	for _, s := range []string{`{"a": [1, 2.50, "x y"], "b" : {"a":1,"a":2}}`, " \"\xff\\u00e9\" ", `{"a":1}x`, `[1,]`, `1e400`, `"\u2028<&>"`, ``} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		var want bytes.Buffer
		wantErr := json.Compact(&want, []byte(v))
		prefix := []byte("prefix:")
		got, err := jsonwire.AppendCompact(append(make([]byte, 0, 8+len(v)), prefix...), []byte(v))
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("AppendCompact(%q): error %v, json.Compact: %v", v, err, wantErr)
		}
		if err != nil {
			if string(got) != string(prefix) {
				t.Fatalf("AppendCompact(%q) failed but left %q", v, got)
			}
			return
		}
		if string(got) != string(prefix)+want.String() {
			t.Fatalf("AppendCompact(%q) = %q, json.Compact %q", v, got, want.String())
		}
	})
}

// FuzzTree checks Tree against encoding/json itself: the same value or both refusing.
func FuzzTree(f *testing.F) {
	for _, s := range []string{
		`{"a":[1,{"b":[0,"x"]}],"c":-0.5E+3,"d":null,"e":true,"f":false}`, `{"a":1,"a":2}`, `[]`, `{}`,
		"{\"k\xff\":\"v\xfe\"}", `{"s":"\ud83d\ude00\n\u00e9"}`, `  7 `, `{"a":1} {}`, `{"a":1,}`, `[1 2]`,
		`"x"`, `null`, `{"n":12345678901234567890123456789.5e-7}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := jsonwire.Tree(b)
		var want any
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		werr := d.Decode(&want)
		if werr == nil && d.More() {
			werr = errors.New("more than one value")
		}
		if werr == nil {
			if _, e := d.Token(); e != io.EOF {
				werr = errors.New("trailing")
			}
		}
		if (err == nil) != (werr == nil) {
			t.Fatalf("Tree(%q): error %v, encoding/json's %v", b, err, werr)
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("Tree(%q) = %#v, encoding/json decodes %#v", b, got, want)
		}
	})
}

// FuzzAppendTree checks AppendTree against json.Marshal, byte for byte, on what Tree decodes and
// on strings and numbers of any bytes.
func FuzzAppendTree(f *testing.F) {
	for _, s := range []string{
		`{"b":[1,{"a":"<x>&\u2028"}],"a":-0.5E+3,"d":null,"e":true}`, "{\"k\xff\":\"v\xfe\\u0001\\b\\f\"}", `[]`, `"x"`,
	} {
		f.Add([]byte(s), "1e5")
	}
	f.Add([]byte(`{}`), "")
	f.Add([]byte(`{}`), " 1")
	f.Add([]byte(`{}`), "01")
	f.Fuzz(func(t *testing.T, b []byte, n string) {
		for _, v := range []any{map[string]any{"s": string(b), "n": json.Number(n)}, json.Number(n), string(b)} {
			got, err := jsonwire.AppendTree(nil, v)
			want, werr := json.Marshal(v)
			if (err == nil) != (werr == nil) || err == nil && !bytes.Equal(got, want) {
				t.Fatalf("AppendTree(%#v) = %s, %v; json.Marshal: %s, %v", v, got, err, want, werr)
			}
		}
		tree, err := jsonwire.Tree(b)
		if err != nil {
			return
		}
		got, err := jsonwire.AppendTree(nil, tree)
		want, werr := json.Marshal(tree)
		if err != nil || werr != nil || !bytes.Equal(got, want) {
			t.Fatalf("AppendTree(Tree(%q)) = %s, %v; json.Marshal: %s, %v", b, got, err, want, werr)
		}
	})
}
