package jsonwire_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	"carehub/kernel/jsonwire"
)

func TestStorable(t *testing.T) {
	deep := strings.Repeat("[", jsonwire.MaxStorableDepth+1) + strings.Repeat("]", jsonwire.MaxStorableDepth+1)
	for _, c := range []struct{ in, path string }{
		{`{"n":1e999999}`, "n"},
		{`{"n":-1e309}`, "n"},
		{`{"n":1e-400}`, "n"},
		{`{"n":0e99999}`, "n"},
		{`{"n":` + strings.Repeat("9", 200000) + `}`, "n"},
		{`{"a":[1,{"b":[0,"\ud800"]}]}`, "a[1].b[1]"},
		{`{"s":"x\udc00"}`, "s"},
		{`{"s":"\ud800\u0041"}`, "s"},
		{`{"s":"a\u0000"}`, "s"},
		{`{"\ud800":1}`, `"\\ud800"`},
		{"{\"s\":\"\xff\"}", "s"},
		{`{"a":` + deep + `}`, "a" + strings.Repeat("[0]", jsonwire.MaxStorableDepth-1)},
	} {
		err := jsonwire.Storable([]byte(c.in))
		var se *jsonwire.StorableError
		if !errors.As(err, &se) {
			t.Errorf("Storable(%.40q) = %v, want a StorableError", c.in, err)
			continue
		}
		if se.Path != c.path {
			t.Errorf("Storable(%.40q) path %q, want %q (%v)", c.in, se.Path, c.path, err)
		}
		if strings.Contains(err.Error(), "999") || strings.Contains(err.Error(), "\xff") {
			t.Errorf("the error quotes the value: %v", err)
		}
	}
	for _, ok := range []string{
		`{}`, `{"n":1e308,"m":-5e-324,"z":0e5,"f":0.000000000000000000001,"i":12345678901234567890}`,
		`{"s":"\ud83d\ude00 \\ud800 é \n","k":[true,false,null,{"":[]}]}`,
		` { "a" : [ 1 , 2 ] , "b" : { } } `, `"x"`, `1`, `[]`,
		strings.Repeat("[", jsonwire.MaxStorableDepth) + strings.Repeat("]", jsonwire.MaxStorableDepth),
	} {
		if err := jsonwire.Storable([]byte(ok)); err != nil {
			t.Errorf("Storable(%.60q) = %v, want nil", ok, err)
		}
	}
}

// FuzzStorable checks Storable against encoding/json: what it accepts is valid JSON whose
// numbers are finite doubles, not rounded to zero, and whose strings decode without a
// replacement of an invalid code point or a NUL; and it never panics.
//
//	go test -run '^$' -fuzz FuzzStorable -fuzztime 60s ./kernel/jsonwire/
func FuzzStorable(f *testing.F) {
	for _, s := range []string{
		`{"n":1e999999}`, `{"s":"\ud800"}`, `{"\udc00":1}`, `{"s":"\ud83d\ude00"}`, `{"n":1e-400}`,
		`{"a":[1,{"b":[0,"x\u0000"]}],"c":-0.5E+3}`, `[[[[]]]]`, `{"a":"b\\"}`, "{\"k\xff\":1}",
		`{"n":12345678901234567890123456789}`, `0e9999`, `{"a":1,}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		err := jsonwire.Storable(b)
		if !json.Valid(b) {
			if !errors.Is(err, jsonwire.ErrInvalidJSON) {
				t.Fatalf("Storable(%q) accepted invalid JSON", b)
			}
			return
		}
		if err != nil {
			return
		}
		var v any
		d := json.NewDecoder(strings.NewReader(string(b)))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			t.Fatalf("Storable(%q) accepted what encoding/json cannot decode: %v", b, err)
		}
		check(t, b, v)
	})
}

// check fails t for a number or string in v that a store could not hold as written in b.
func check(t *testing.T, b []byte, v any) {
	t.Helper()
	switch x := v.(type) {
	case json.Number:
		f, err := x.Float64()
		if err != nil || math.IsInf(f, 0) || len(x) > jsonwire.MaxNumberLength {
			t.Fatalf("Storable(%q) accepted the number %s", b, x)
		}
		if f == 0 && strings.ContainsAny(strings.Split(strings.ToLower(string(x)), "e")[0], "123456789") {
			t.Fatalf("Storable(%q) accepted the number %s, which underflows", b, x)
		}
	case string:
		checkString(t, b, x)
	case []any:
		for _, e := range x {
			check(t, b, e)
		}
	case map[string]any:
		for k, e := range x {
			checkString(t, b, k)
			check(t, b, e)
		}
	}
}

func checkString(t *testing.T, b []byte, s string) {
	t.Helper()
	// encoding/json decodes an unpaired surrogate escape and invalid UTF-8 as U+FFFD; a U+FFFD
	// the input did not write as such is one of them.
	if strings.ContainsRune(s, 0) || (strings.ContainsRune(s, utf8.RuneError) && !strings.Contains(string(b), "\ufffd") && !strings.Contains(strings.ToLower(string(b)), `\ufffd`)) {
		t.Fatalf("Storable(%q) accepted the string %q", b, s)
	}
}
