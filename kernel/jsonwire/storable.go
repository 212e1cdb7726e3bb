package jsonwire

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits of Storable: what every store of carehub takes as it stands (Postgres jsonb, whose
// numbers are numeric, and ClickHouse, whose JSON functions read numbers as doubles).
const (
	// MaxNumberLength bounds a number's literal. A finite double needs at most 24 characters;
	// the rest is room for zeros people write. numeric refuses an exponent past ±1000 and a
	// 200,000-digit integer costs every reader; nothing a client means needs more.
	MaxNumberLength = 64
	// MaxStorableDepth bounds how deep arrays and objects nest: Postgres parses JSON
	// recursively and refuses, as a whole statement, what exhausts its stack.
	MaxStorableDepth = 128
	// maxExponent bounds an exponent as written: a finite, non-zero double of at most
	// MaxNumberLength characters never needs more, and 0e99999 is a zero numeric refuses.
	maxExponent = 400
)

// ErrInvalidJSON is Storable's error for what is not one JSON value: a caller whose own decoder
// words that better lets it through.
var ErrInvalidJSON = errors.New("not valid JSON")

// StorableError says where and why a JSON value cannot be stored. Its message never quotes a
// value, which may be patient data; Path may name a member, which is the client's own key.
type StorableError struct {
	// Path is the value's place, as a.b[2].c; "" for the value itself.
	Path string
	// Reason says what is wrong, as "is a number out of range".
	Reason string
}

func (e *StorableError) Error() string {
	if e.Path == "" {
		return "the value " + e.Reason
	}
	return e.Path + " " + e.Reason
}

// Storable reports, as a *StorableError, why the JSON value data could not be stored as it
// stands by the event log's stores, and nil when it can: a number must be a finite, non-zero
// (unless written as zero) IEEE double of at most MaxNumberLength characters, a string or member
// name valid UTF-8 without the escape \u0000 or an unpaired UTF-16 surrogate escape (\ud800),
// and nesting at most MaxStorableDepth deep. Postgres refuses all of them (SQLSTATE 22P02,
// 22003, 22P05, 54001), and what one writer refuses it retries: so every path that puts a
// client's JSON into an event checks it first. It returns ErrInvalidJSON for what is not one
// JSON value.
func Storable(data []byte) error {
	if !Valid(data) {
		return ErrInvalidJSON
	}
	w := storableWalk{b: data}
	w.value(SkipSpace(data, 0))
	if w.err != nil {
		return w.err
	}
	return nil
}

// storableWalk walks a valid JSON value, stopping at the first thing a store refuses. path
// holds the members and indexes down to the value being read; it is spelled out only for
// the error.
type storableWalk struct {
	b    []byte
	path []pathPart
	err  *StorableError
}

type pathPart struct {
	key   []byte // the member's name as written, escapes and all; nil for an element
	index int
}

// value checks the value at b[i] and returns the index just past it.
func (w *storableWalk) value(i int) int {
	switch c := w.b[i]; {
	case c == '{' || c == '[':
		return w.container(i)
	case c == '"':
		end := skipValue(w.b, i)
		if what := unstorableString(w.b[i+1 : end-1]); what != "" {
			w.fail("is a string with " + what)
		}
		return end
	case c == '-' || c >= '0' && c <= '9':
		end := skipValue(w.b, i)
		if reason := unstorableNumber(w.b[i:end]); reason != "" {
			w.fail(reason)
		}
		return end
	default: // true, false, null
		return skipValue(w.b, i)
	}
}

// container checks the object or array at b[i].
func (w *storableWalk) container(i int) int {
	if len(w.path) == MaxStorableDepth {
		w.fail(fmt.Sprintf("nests deeper than %d arrays and objects", MaxStorableDepth))
		return len(w.b)
	}
	object, close := w.b[i] == '{', byte(']')
	if object {
		close = '}'
	}
	w.path = append(w.path, pathPart{})
	defer func() { w.path = w.path[:len(w.path)-1] }()
	for n := 0; w.err == nil; n++ {
		i = SkipSpace(w.b, i+1) // past '{', '[' or ','
		if w.b[i] == close {
			return i + 1
		}
		w.path[len(w.path)-1] = pathPart{index: n}
		if object {
			end := skipValue(w.b, i)
			w.path[len(w.path)-1].key = w.b[i+1 : end-1]
			if what := unstorableString(w.b[i+1 : end-1]); what != "" {
				w.fail("has a member name with " + what)
				return len(w.b)
			}
			i = SkipSpace(w.b, SkipSpace(w.b, end)+1) // past ':'
		}
		i = SkipSpace(w.b, w.value(i))
		if w.err == nil && w.b[i] == close {
			return i + 1
		}
	}
	return len(w.b)
}

// fail records reason for the value at the current path.
func (w *storableWalk) fail(reason string) {
	var p strings.Builder
	for _, part := range w.path {
		switch {
		case part.key == nil:
			fmt.Fprintf(&p, "[%d]", part.index)
		default:
			if p.Len() > 0 {
				p.WriteByte('.')
			}
			p.WriteString(printableKey(part.key))
		}
	}
	w.err = &StorableError{Path: p.String(), Reason: reason}
}

// printableKey is a member name for a path: as written when it is plain, quoted otherwise (a
// name with escapes, or one a store refused, is shown escaped, never raw).
func printableKey(key []byte) string {
	if len(key) <= 64 && !needsUnquote(key) && !bytes.ContainsAny(key, ".[]\"") {
		return string(key)
	}
	if len(key) > 64 {
		key = key[:64]
	}
	return strconv.QuoteToASCII(string(key))
}

// unstorableString says what is wrong with the inside of a JSON string (as written), "" when
// nothing is: invalid UTF-8, \u0000 or an unpaired surrogate escape.
func unstorableString(s []byte) string {
	if !utf8.Valid(s) {
		return "invalid UTF-8"
	}
	if bytes.IndexByte(s, '\\') < 0 {
		return ""
	}
	switch msg := UnstorableEscape(s); {
	case msg == "":
		return ""
	case strings.Contains(msg, "surrogate"):
		return `an unpaired UTF-16 surrogate escape (\ud800-\udfff)`
	default:
		return `the escape \u0000`
	}
}

// unstorableNumber says what is wrong with the JSON number literal n, "" when nothing is.
func unstorableNumber(n []byte) string {
	if len(n) > MaxNumberLength {
		return fmt.Sprintf("is a number of %d characters; at most %d are allowed", len(n), MaxNumberLength)
	}
	mantissa := n
	if at := bytes.IndexAny(n, "eE"); at >= 0 {
		mantissa = n[:at]
		e, err := strconv.Atoi(string(bytes.TrimPrefix(n[at+1:], []byte("+"))))
		if err != nil || e > maxExponent || e < -maxExponent {
			return "is a number out of range (not a finite double)"
		}
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil {
		return "is a number out of range (not a finite double)"
	}
	if f == 0 && bytes.ContainsAny(mantissa, "123456789") {
		return "is a number too small to be a double (it would be stored as 0)"
	}
	return ""
}
