// Package jsonwire reads and writes JSON without reflection, for the hot paths that handle a
// record at a time at tens of thousands a second: the observation writer's records, every
// consumer's event envelopes and every call's audit record. Each decoder built on it decodes as
// json.Unmarshal into its struct would, which a fuzz test beside it checks against
// encoding/json itself. Tree and AppendTree decode and encode the resources the FHIR base writes
// as encoding/json would, without reflection. Everything else in carehub uses encoding/json.
//
// Reading is two steps: Valid checks a whole record once, then Members walks its top-level
// object without checking again, handing each value to String, Strings, Int, Float, Bool or the
// type's own UnmarshalJSON. A Reader does both in one pass for what is plain JSON (ValidMembers
// for the observation writer's records; intake's fast path for a device's observation), and
// leaves the rest to them.
package jsonwire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// asEncodingJSON makes jsontext accept what encoding/json accepts: repeated keys and invalid
// UTF-8 (which the decoders replace, as encoding/json does).
var asEncodingJSON = []jsontext.Options{jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)}

// Valid reports whether b is one valid JSON value, as json.Valid does. It is jsontext's
// validator (the Go team's encoding/json/v2 syntax layer), three to four times json.Valid's
// speed.
func Valid(b []byte) bool { return jsontext.Value(b).IsValid(asEncodingJSON...) }

// AppendCompact appends the JSON value v to b with its insignificant whitespace removed, as
// json.Compact does (strings and numbers as they stand), and fails, appending nothing, when v is
// not one valid JSON value (as json.Valid judges it). It is jsontext's compaction: one pass that
// also validates, about twice json.Compact's speed.
func AppendCompact(b, v []byte) ([]byte, error) {
	start := len(b)
	out := jsontext.Value(append(b, v...)[start:])
	if err := out.Compact(); err != nil {
		return b, err
	}
	return append(b, out...), nil
}

// AppendCompactValid appends the JSON value v, which must be valid (Valid), to b with its
// insignificant whitespace removed, as AppendCompact does without checking it again: a few
// times its speed, for a value read from a record that was checked whole. It works token by
// token, so v may also be a run of a valid array's elements.
func AppendCompactValid(b, v []byte) []byte {
	start := 0 // v[start:i] is still to be copied
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case '"':
			for i++; i < len(v) && v[i] != '"'; i++ {
				if v[i] == '\\' {
					i++
				}
			}
		case ' ', '\t', '\r', '\n':
			b = append(b, v[start:i]...)
			start = i + 1
		}
	}
	return append(b, v[start:]...)
}

// Members calls fn with each member of the JSON object obj, in order: its key, unescaped, and
// its value exactly as it stands in obj. obj must be Valid; Members returns nil at once for a
// value that is not an object, and the first error fn returns, prefixed with the key.
func Members(obj []byte, fn func(key, value []byte) error) error {
	return MemberSpans(obj, func(key, value []byte, _, _ int) error { return fn(key, value) })
}

// MemberSpans is Members that also says where each member stands in obj: obj[start:end] is the
// member as written, from its key's opening quote to the end of its value.
func MemberSpans(obj []byte, fn func(key, value []byte, start, end int) error) error {
	i := SkipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return nil
	}
	i++
	for {
		i = SkipSpace(obj, i)
		if i >= len(obj) || obj[i] != '"' {
			return nil // '}': the end of the object
		}
		start := i
		keyEnd := skipValue(obj, i)
		key := obj[i+1 : keyEnd-1]
		if needsUnquote(key) {
			var k string
			if err := json.Unmarshal(obj[i:keyEnd], &k); err != nil {
				return err
			}
			key = []byte(k)
		}
		i = SkipSpace(obj, keyEnd) + 1 // past ':'
		i = SkipSpace(obj, i)
		end := skipValue(obj, i)
		if err := fn(key, obj[i:end], start, end); err != nil {
			return prefixed(key, err)
		}
		i = SkipSpace(obj, end)
		if i < len(obj) && obj[i] == ',' {
			i++
		}
	}
}

// prefixed is the error fn returned for the member key.
func prefixed(key []byte, err error) error { return fmt.Errorf("%s: %w", key, err) }

// Elements calls fn with each element of the JSON array arr, in order, exactly as it stands in
// arr. arr must be Valid; Elements returns nil at once for a value that is not an array, and the
// first error fn returns.
func Elements(arr []byte, fn func(value []byte) error) error {
	i := SkipSpace(arr, 0)
	if i >= len(arr) || arr[i] != '[' {
		return nil
	}
	i++
	for {
		i = SkipSpace(arr, i)
		if i >= len(arr) || arr[i] == ']' {
			return nil
		}
		end := skipValue(arr, i)
		if err := fn(arr[i:end]); err != nil {
			return err
		}
		i = SkipSpace(arr, end)
		if i < len(arr) && arr[i] == ',' {
			i++
		}
	}
}

// Fold returns the name of names that key matches case-insensitively, as encoding/json matches
// a key no field names exactly, and "" when none does.
func Fold(key []byte, names []string) string {
	for _, name := range names {
		if strings.EqualFold(string(key), name) {
			return name
		}
	}
	return ""
}

// IsNull reports whether the value v is null, which encoding/json decodes into any field by
// leaving it as it was.
func IsNull(v []byte) bool { return string(v) == "null" }

// String decodes the JSON string v into s; null leaves s as it was. A string without escapes
// and of valid UTF-8, the common case, is its bytes; any other goes through encoding/json, which
// unescapes it and replaces invalid UTF-8.
func String(v []byte, s *string) error {
	if IsNull(v) {
		return nil
	}
	if len(v) < 2 || v[0] != '"' {
		return errors.New("not a string")
	}
	inner := v[1 : len(v)-1]
	if !needsUnquote(inner) {
		*s = string(inner)
		return nil
	}
	return json.Unmarshal(v, s)
}

// PlainString returns the inside of the JSON string that starts at b[i] and the index just past
// its closing quote, when the string holds no escape, no control character and only valid
// UTF-8 (then its bytes are its value); ok is false otherwise, and for anything but a string.
// b need not be Valid: PlainString reads no further than the string's closing quote.
func PlainString(b []byte, i int) (s []byte, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	ascii := true
	for j := i + 1; j < len(b); j++ { // one pass: the strings read are short
		switch c := b[j]; {
		case c == '"':
			s = b[i+1 : j]
			if !ascii && !utf8.Valid(s) {
				return nil, 0, false
			}
			return s, j + 1, true
		case c == '\\' || c < 0x20:
			return nil, 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, 0, false
}

// needsUnquote reports whether the inside of a JSON string holds an escape or invalid UTF-8.
// (Up to 2026-11-27 it stopped at the first non-ASCII byte, so an escape after one, as in
// "é\n", was taken as it stood, backslash and all.)
func needsUnquote(b []byte) bool {
	if bytes.IndexByte(b, '\\') >= 0 {
		return true
	}
	for _, c := range b {
		if c >= utf8.RuneSelf {
			return !utf8.Valid(b)
		}
	}
	return false
}

// Strings decodes the JSON array of strings v into ss as encoding/json does: null sets ss to nil,
// [] to an empty slice, and a null element is "".
func Strings(v []byte, ss *[]string) error {
	if IsNull(v) {
		*ss = nil
		return nil
	}
	if len(v) == 0 || v[0] != '[' {
		return errors.New("not an array")
	}
	out := []string{}
	err := Elements(v, func(e []byte) error {
		var s string
		if err := String(e, &s); err != nil {
			return err
		}
		out = append(out, s)
		return nil
	})
	if err != nil {
		return err
	}
	*ss = out
	return nil
}

// Int decodes the JSON number v into n as encoding/json does into an int: an integer within
// int's range, neither fraction nor exponent; null leaves n as it was.
func Int(v []byte, n *int) error {
	if IsNull(v) {
		return nil
	}
	if len(v) == 0 || v[0] != '-' && (v[0] < '0' || v[0] > '9') {
		return errors.New("not a number")
	}
	x, err := strconv.ParseInt(string(v), 10, 0)
	if err != nil {
		return errors.New("not an integer within range")
	}
	*n = int(x)
	return nil
}

// Float decodes the JSON number v into f; null leaves f as it was. A number out of float64's
// range is an error, as in encoding/json.
func Float(v []byte, f *float64) error {
	if IsNull(v) {
		return nil
	}
	if len(v) == 0 || v[0] != '-' && (v[0] < '0' || v[0] > '9') {
		return errors.New("not a number")
	}
	x, err := strconv.ParseFloat(string(v), 64)
	if err != nil {
		return errors.New("not a finite number")
	}
	*f = x
	return nil
}

// Bool decodes the JSON boolean v into b; null leaves b as it was.
func Bool(v []byte, b *bool) error {
	switch string(v) {
	case "true", "false":
		*b = v[0] == 't'
	case "null":
	default:
		return errors.New("not a boolean")
	}
	return nil
}

// Time decodes the JSON string v, an RFC 3339 time, into t as time.Time's UnmarshalJSON does;
// null leaves t as it was. Its error does not quote v, which may be a patient's date.
func Time(v []byte, t *time.Time) error {
	if err := t.UnmarshalJSON(v); err != nil {
		return errors.New("not an RFC 3339 time")
	}
	return nil
}

// SkipSpace returns the index of the first byte of b from i that is not JSON whitespace.
func SkipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// skipValue returns the index just past the valid JSON value that starts at b[i].
func skipValue(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i // the end of a number or literal
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\r', '\n':
			if depth == 0 {
				return i // the end of a number or literal
			}
		}
	}
	return i
}

// AppendString appends s as a JSON string. Only the characters JSON requires escaping are
// escaped (encoding/json also escapes <, > and & for HTML; the two decode alike), and s is
// expected to be valid UTF-8, as what a JSON decoder produced is.
func AppendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = appendEscape(append(b, s[start:i]...), c)
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendEscape appends the ASCII byte c escaped in a JSON string: \", \\, \n, \r and \t, and
// \u00XX for the rest.
func appendEscape(b []byte, c byte) []byte {
	const hex = "0123456789abcdef"
	switch c {
	case '"', '\\':
		return append(b, '\\', c)
	case '\n':
		return append(b, '\\', 'n')
	case '\r':
		return append(b, '\\', 'r')
	case '\t':
		return append(b, '\\', 't')
	}
	return append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
}

// AppendFloat appends f as encoding/json writes a float64: fixed notation, exponent notation
// below 1e-6 and from 1e21, with the exponent's leading zero dropped. f must be finite (it was
// parsed from JSON).
func AppendFloat(b []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if n := len(b); format == 'e' && n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
		b[n-2] = b[n-1] // e-07 → e-7
		b = b[:n-1]
	}
	return b
}

// UnstorableEscape finds the string escapes of the JSON value raw that Postgres cannot read: the
// escape \u0000 and unpaired UTF-16 surrogate escapes, which jsonb refuses and the json type stores
// but its operators (->>, casts to jsonb) then fail on. It returns what is wrong, "" when nothing
// is. A malformed escape is left to the decoder.
func UnstorableEscape(raw []byte) string {
	for i := 0; i < len(raw); {
		j := bytes.IndexByte(raw[i:], '\\')
		if j < 0 || i+j+1 >= len(raw) {
			break
		}
		i += j
		if raw[i+1] != 'u' {
			i += 2 // \" \\ \n …: skip both, so that \\u is not read as an escape
			continue
		}
		r, ok := hex4(raw, i+2)
		switch {
		case !ok:
			return "" // malformed: the decoder reports it
		case r == 0:
			return `the escape \u0000 is not accepted`
		case r >= 0xd800 && r < 0xdc00:
			lo, ok := hex4(raw, i+8)
			if !ok || raw[i+6] != '\\' || raw[i+7] != 'u' || lo < 0xdc00 || lo > 0xdfff {
				return "a \\u escape is an unpaired UTF-16 surrogate"
			}
			i += 12
			continue
		case r >= 0xdc00 && r <= 0xdfff:
			return "a \\u escape is an unpaired UTF-16 surrogate"
		}
		i += 6
	}
	return ""
}

func hex4(b []byte, at int) (rune, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
