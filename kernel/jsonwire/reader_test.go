package jsonwire_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"carehub/kernel/jsonwire"
)

// readerSeeds are JSON values and near-misses for the Reader's fuzz tests.
var readerSeeds = []string{
	`{"a":1,"b":"x","c":{"d":[1,2,{"e":"}"}]},"f":null,"g":true,"h":-1.5e-7,"i":0,"j":1E+2}`,
	` { "a" : "\"\\\/\b\f\n\r\t\u00e9\ud800" , "a":[ ] ,"b":{} } `,
	"{\"k\":\"v\xfe\"}", "{\"k\xff\":1}", `{"\u0062":1}`, `{"a":"\x"}`, `{"a":"\u12"}`, "{\"a\":\"\x01\"}",
	`{}`, `[]`, `"x"`, `1`, `null`, `{"a":}`, `{"a":1,}`, `{"a"`, `{"a":1}x`, `{"a":01}`, `{"a":1.}`,
	`{"a":-}`, `{"a":1e}`, `{"a":.5}`, `{"a":tru}`, `{"a":[1,]}`, `{"a":[1 2]}`, `{"a" 1}`, `{"a":1 "b":2}`,
	`{"a":` + strings.Repeat("[", jsonwire.MaxReaderDepth) + strings.Repeat("]", jsonwire.MaxReaderDepth) + `}`,
}

// member is one call of a Members callback.
type member struct{ key, value string }

// FuzzValidMembers: what ValidMembers takes is Valid, and it hands fn the members Members
// hands it, with the same error.
//
//	go test -run '^$' -fuzz FuzzValidMembers -fuzztime 60s ./kernel/jsonwire/
func FuzzValidMembers(f *testing.F) {
	for _, s := range readerSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		collect := func(ms *[]member) func(k, v []byte) error {
			return func(k, v []byte) error {
				*ms = append(*ms, member{string(k), string(v)})
				if string(k) == "err" {
					return errors.New("refused")
				}
				return nil
			}
		}
		var got, want []member
		ok, err := jsonwire.ValidMembers(b, collect(&got))
		if !ok {
			return
		}
		if !jsonwire.Valid(b) {
			t.Fatalf("ValidMembers took %q, which is not valid", b)
		}
		wantErr := jsonwire.Members(b, collect(&want))
		if fmt.Sprint(err) != fmt.Sprint(wantErr) || !slices.Equal(got, want) {
			t.Fatalf("ValidMembers(%q) = %v, %v; Members: %v, %v", b, got, err, want, wantErr)
		}
	})
}

// FuzzReaderSkip: a value Skip reads whole is Valid.
func FuzzReaderSkip(f *testing.F) {
	for _, s := range readerSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if r := jsonwire.NewReader(b); r.Skip() && r.End() && !jsonwire.Valid(b) {
			t.Fatalf("Skip read %q, which is not valid", b)
		}
	})
}

// TestValidMembers: a record's usual shapes are read in one pass; an escaped key, nesting past
// the bound and what is not a JSON object are left to Valid and Members; a member's error is
// returned once the whole record is known to be valid.
func TestValidMembers(t *testing.T) {
	for _, s := range []string{readerSeeds[0], readerSeeds[1], "{\"k\":\"v\xfe\"}", `{}`, ` {"err":1,"b":2} `} {
		var ms []member
		ok, err := jsonwire.ValidMembers([]byte(s), func(k, v []byte) error {
			ms = append(ms, member{string(k), string(v)})
			return nil
		})
		if !ok || err != nil {
			t.Errorf("ValidMembers(%s) = %v, %v", s, ok, err)
		}
	}
	for _, s := range []string{`{"\u0062":1}`, readerSeeds[len(readerSeeds)-1], `[]`, `1`, `{"a":1}x`, `{"a":1,}`} {
		if ok, _ := jsonwire.ValidMembers([]byte(s), func(k, v []byte) error { return nil }); ok {
			t.Errorf("ValidMembers took %s", s)
		}
	}
	refuse := func(k, v []byte) error {
		if string(k) == "b" {
			return errors.New("refused")
		}
		return nil
	}
	if ok, err := jsonwire.ValidMembers([]byte(`{"a":1,"b":2,"c":3}`), refuse); !ok || err == nil || err.Error() != "b: refused" {
		t.Errorf("ValidMembers with a refused member = %v, %v", ok, err)
	}
	if ok, _ := jsonwire.ValidMembers([]byte(`{"a":1,"b":2,"c":}`), refuse); ok {
		t.Error("ValidMembers took an invalid record after a refused member")
	}
}

// TestFields: exact names are read, others skipped; a name given twice or one that may match in
// another case is refused.
func TestFields(t *testing.T) {
	names := []string{"status", "valueQuantity"}
	read := func(s string) (got []string, ok bool) {
		r := jsonwire.NewReader([]byte(s))
		ok = r.Fields(names, func(i int) bool {
			v, ok := r.Plain()
			got = append(got, names[i]+"="+string(v))
			return ok
		}) && r.End()
		return got, ok
	}
	if got, ok := read(`{"x":{"status":[1]},"valueQuantity":"q","status":"final","other":"\n"}`); !ok || !slices.Equal(got, []string{"valueQuantity=q", "status=final"}) {
		t.Errorf("Fields = %v, %v", got, ok)
	}
	for _, s := range []string{`{"status":"a","status":"b"}`, `{"Status":"a"}`, `{"value_quantity":"a"}`, `{"ſtatus":"a"}`, `{"status":1}`} {
		if got, ok := read(s); ok {
			t.Errorf("Fields took %s: %v", s, got)
		}
	}
}
