// Package fhirjson writes resources in the FHIR base's JSON form: a resource's id and every
// reference in FHIR id form (ids.FHIR), nulls and empty arrays and objects removed (FHIR JSON has
// none), resourceType first. The FHIR base answers every resource in it; Subscriptions'
// full-resource notifications and Bulk Data's files are written in it.
package fhirjson

import (
	"bytes"
	"errors"
	"strings"
	"unsafe"

	"carehub/kernel/ids"
	"carehub/kernel/jsonwire"
)

// errNotJSON is Rewrite's answer to what is not one JSON value.
var errNotJSON = errors.New("not a JSON value")

// Rewrite puts the JSON value b in FHIR form: a resource's id and every reference (Type/id,
// Type/id/_history/n) in FHIR id form, nulls and empty arrays and objects removed. It is one pass
// over the bytes, without decoding them: members keep their order, except
// that a resource's resourceType comes first (as FHIR's JSON format asks), and strings and
// numbers keep their exact text, apart from the ids and references it rewrites. An object with
// a repeated key (which neither the stores nor encoding/json write) keeps every member.
func Rewrite(b []byte) ([]byte, error) {
	return AppendRewrite(make([]byte, 0, len(b)), b)
}

// AppendRewrite appends Rewrite of b to dst.
func AppendRewrite(dst, b []byte) ([]byte, error) {
	if !jsonwire.Valid(b) {
		return dst, errNotJSON
	}
	return appendRewrite(dst, b), nil
}

// AppendRewriteValid is AppendRewrite of b that is one valid JSON value already (what a store's
// renderer writes): it leaves out the validation pass, two fifths of the rewrite's time. Of
// other b it answers an error or something wrong, never a panic.
func AppendRewriteValid(dst, b []byte) (out []byte, err error) {
	defer func() {
		if recover() != nil {
			out, err = dst, errNotJSON
		}
	}()
	if len(b) == 0 {
		return dst, errNotJSON
	}
	return appendRewrite(dst, b), nil
}

// appendRewrite appends Rewrite of the valid JSON value b to dst.
func appendRewrite(dst, b []byte) []byte {
	i := jsonwire.SkipSpace(b, 0)
	if b[i] == 'n' {
		return append(dst, "null"...)
	}
	out, _, kept := tidyValue(dst, b, i)
	switch { // an object or array left empty is still the answer
	case kept:
	case b[i] == '{':
		out = append(out[:len(dst)], "{}"...)
	default:
		out = append(out[:len(dst)], "[]"...)
	}
	return out
}

// tidyValue appends the valid JSON value that starts at b[i] to out, without its insignificant
// space, nulls, or empty arrays and objects, and returns out, the index in b just past the value,
// and whether anything of it remained (when nothing did, the caller cuts out back).
func tidyValue(out, b []byte, i int) ([]byte, int, bool) {
	switch b[i] {
	case 'n':
		return out, i + 4, false
	case '{':
		return tidyObject(out, b, i)
	case '[':
		return tidyArray(out, b, i)
	case '"':
		end := stringEnd(b, i)
		return append(out, b[i:end]...), end, true
	}
	end := i + 1 // a number, true or false
	for end < len(b) && !isDelimiter(b[end]) {
		end++
	}
	return append(out, b[i:end]...), end, true
}

func isDelimiter(c byte) bool {
	return c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\r' || c == '\n'
}

// stringEnd returns the index just past the JSON string that starts at b[i].
func stringEnd(b []byte, i int) int {
	for i++; i < len(b) && b[i] != '"'; i++ {
		if b[i] == '\\' {
			i++
		}
	}
	return i + 1
}

func tidyObject(out, b []byte, i int) ([]byte, int, bool) {
	start := len(out)
	out = append(out, '{')
	n := 0
	idAt, idEnd, typeAt, typeEnd := -1, -1, -1, -1 // in out: id's string; the resourceType member
	for i++; ; {
		i = jsonwire.SkipSpace(b, i)
		if b[i] == ',' {
			i = jsonwire.SkipSpace(b, i+1)
		}
		if b[i] == '}' {
			i++
			break
		}
		keyStart, keyEnd := i, stringEnd(b, i)
		key := memberName(b[keyStart:keyEnd])
		i = jsonwire.SkipSpace(b, jsonwire.SkipSpace(b, keyEnd)+1) // past ':'
		mark := len(out)
		if n > 0 {
			out = append(out, ',')
		}
		out = append(out, b[keyStart:keyEnd]...)
		out = append(out, ':')
		kept := true
		switch {
		case b[i] == '"' && key == "reference":
			end := stringEnd(b, i)
			out = appendReference(out, b[i:end])
			i = end
		case b[i] == '"' && key == "id":
			end := stringEnd(b, i)
			idAt = len(out)
			out = append(out, b[i:end]...)
			idEnd = len(out)
			i = end
		default:
			out, i, kept = tidyValue(out, b, i)
		}
		if !kept {
			out = out[:mark]
			continue
		}
		if key == "resourceType" {
			typeAt, typeEnd = mark, len(out)
		}
		n++
	}
	if n == 0 {
		return out[:start], i, false
	}
	if typeAt >= 0 { // a resource: its id in FHIR form, its resourceType first
		if idAt >= 0 {
			var grew int
			out, grew = rewriteID(out, idAt, idEnd)
			if idAt < typeAt {
				typeAt, typeEnd = typeAt+grew, typeEnd+grew
			}
		}
		if typeAt > start+1 {
			member := append([]byte(nil), out[typeAt+1:typeEnd]...) // without its comma
			copy(out[start+1+len(member)+1:typeEnd], out[start+1:typeAt])
			copy(out[start+1:], member)
			out[start+1+len(member)] = ','
		}
	}
	return append(out, '}'), i, true
}

func tidyArray(out, b []byte, i int) ([]byte, int, bool) {
	start := len(out)
	out = append(out, '[')
	n := 0
	for i++; ; {
		i = jsonwire.SkipSpace(b, i)
		if b[i] == ',' {
			i = jsonwire.SkipSpace(b, i+1)
		}
		if b[i] == ']' {
			i++
			break
		}
		mark := len(out)
		if n > 0 {
			out = append(out, ',')
		}
		var kept bool
		if out, i, kept = tidyValue(out, b, i); !kept {
			out = out[:mark]
			continue
		}
		n++
	}
	if n == 0 {
		return out[:start], i, false
	}
	return append(out, ']'), i, true
}

// memberName is an object key (a JSON string with its quotes) as a Go string, unescaped; the
// common key without escapes is compared without being copied.
func memberName(raw []byte) string {
	if bytes.IndexByte(raw, '\\') < 0 {
		return unsafeString(raw[1 : len(raw)-1])
	}
	var s string
	_ = jsonwire.String(raw, &s)
	return s
}

// appendReference appends the JSON string raw, a reference, with its id in FHIR form.
func appendReference(out, raw []byte) []byte {
	if bytes.IndexByte(raw, '\\') >= 0 {
		var s string
		_ = jsonwire.String(raw, &s)
		return jsonwire.AppendString(out, Ref(s, false))
	}
	at := len(out)
	out = append(out, raw...)
	inner := out[at+1 : len(out)-1]
	t, rest, ok := bytes.Cut(inner, []byte("/"))
	if !ok || bytes.IndexByte(t, ':') >= 0 {
		return out // urn:uuid:…, an absolute URL, a fragment
	}
	id, _, _ := bytes.Cut(rest, []byte("/"))
	fhirIDInPlace(id)
	return out
}

// rewriteID puts the id string out[at:end] in FHIR form and reports how much longer out grew.
func rewriteID(out []byte, at, end int) ([]byte, int) {
	raw := out[at:end]
	if bytes.IndexByte(raw, '\\') < 0 {
		fhirIDInPlace(raw[1 : len(raw)-1])
		return out, 0
	}
	var s string
	_ = jsonwire.String(raw, &s)
	repl := jsonwire.AppendString(nil, ids.FHIR(s))
	tail := append(repl, out[end:]...)
	return append(out[:at], tail...), len(repl) - len(raw)
}

// fhirIDInPlace puts a carehub id in FHIR form where it stands: ids.FHIR changes one byte.
func fhirIDInPlace(id []byte) {
	if f := ids.FHIR(unsafeString(id)); f != unsafeString(id) {
		copy(id, f)
	}
}

// unsafeString views b as a string without copying; b must not change while it is in use.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// Ref maps an id, or the id in a relative reference, to its FHIR form.
func Ref(s string, bare bool) string {
	if bare {
		return ids.FHIR(s)
	}
	t, rest, ok := strings.Cut(s, "/")
	if !ok || strings.Contains(t, ":") {
		return s // urn:uuid:…, an absolute URL, a fragment
	}
	id, tail, _ := strings.Cut(rest, "/")
	if tail != "" {
		tail = "/" + tail
	}
	return t + "/" + ids.FHIR(id) + tail
}
