package jsonwire

import "unicode/utf8"

// Reader checks and reads JSON in one pass, for decoders' fast paths: Valid and a walk read a
// record twice. It takes the plain JSON records are made of, and each method reports false for
// anything else (a key or decoded string with an escape, nesting past MaxReaderDepth, and
// whatever is not JSON), never an error: the caller then reads the record its general way,
// which also words the error. Skipped values are checked in full, escapes included.
type Reader struct {
	b     []byte
	i     int
	depth int
}

// MaxReaderDepth bounds the nesting a Reader reads.
const MaxReaderDepth = 32

// NewReader returns a Reader at the start of b.
func NewReader(b []byte) *Reader { return &Reader{b: b} }

// End reports whether only white space is left.
func (r *Reader) End() bool {
	r.space()
	return r.i == len(r.b)
}

func (r *Reader) space() { r.i = SkipSpace(r.b, r.i) }

// Peek returns the next byte after white space, 0 at the end.
func (r *Reader) Peek() byte {
	r.space()
	if r.i < len(r.b) {
		return r.b[r.i]
	}
	return 0
}

// Object reads an object, calling member with each key (a PlainString); member reads the
// value.
func (r *Reader) Object(member func(key []byte) bool) bool {
	return r.container('{', '}', func() bool {
		key, ok := r.Plain()
		if !ok || r.Peek() != ':' {
			return false
		}
		r.i++
		return member(key)
	})
}

// Array reads an array, calling elem to read each element.
func (r *Reader) Array(elem func() bool) bool { return r.container('[', ']', elem) }

// container reads what open and close enclose: items separated by commas, each read by item.
func (r *Reader) container(open, close byte, item func() bool) bool {
	if r.Peek() != open || r.depth == MaxReaderDepth {
		return false
	}
	r.i++
	r.depth++
	if r.Peek() == close {
		r.i++
		r.depth--
		return true
	}
	for {
		if !item() {
			return false
		}
		switch r.Peek() {
		case ',':
			r.i++
		case close:
			r.i++
			r.depth--
			return true
		default:
			return false
		}
	}
}

// Plain reads a string that is its bytes (PlainString) and returns them.
func (r *Reader) Plain() ([]byte, bool) {
	r.space()
	s, next, ok := PlainString(r.b, r.i)
	if ok {
		r.i = next
	}
	return s, ok
}

// Raw reads any value (Skip) and returns it as it stands.
func (r *Reader) Raw() ([]byte, bool) {
	r.space()
	start := r.i
	ok := r.Skip()
	return r.b[start:r.i], ok
}

// Skip reads any value, checking it is JSON as Valid does.
func (r *Reader) Skip() bool {
	switch r.Peek() {
	case '"':
		return r.skipString()
	case '{':
		return r.Object(func([]byte) bool { return r.Skip() })
	case '[':
		return r.Array(r.Skip)
	case 't':
		return r.literal("true")
	case 'f':
		return r.literal("false")
	case 'n':
		return r.literal("null")
	}
	_, ok := r.Number()
	return ok
}

// skipString reads a string, escapes and all; like Valid, it takes invalid UTF-8.
func (r *Reader) skipString() bool {
	b := r.b
	for j := r.i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			r.i = j + 1
			return true
		case c < 0x20:
			return false
		case c == '\\':
			if j++; j == len(b) {
				return false
			}
			switch b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if _, ok := hex4(b, j+1); !ok {
					return false
				}
				j += 4
			default:
				return false
			}
		}
	}
	return false
}

func (r *Reader) literal(l string) bool {
	if len(r.b)-r.i < len(l) || string(r.b[r.i:r.i+len(l)]) != l {
		return false
	}
	r.i += len(l)
	return true
}

// Number reads a JSON number and returns its text.
func (r *Reader) Number() ([]byte, bool) {
	r.space()
	b, i := r.b, r.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(b, i)
	default:
		return nil, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return nil, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return nil, false
		}
		i = j
	}
	start := r.i
	r.i = i
	return b[start:i], true
}

func digits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}

// Fields reads an object whose members names lists (at most 64), for decoders that match names
// exactly: field is called with the index in names of each member the object has, and reads
// its value; other members are skipped. It reports false for a name given twice and for one
// that may match a name in another case (which encoding/json and jsonv1 decode as that name;
// see foldsTo).
func (r *Reader) Fields(names []string, field func(i int) bool) bool {
	var seen uint64
	return r.Object(func(key []byte) bool {
		for i, n := range names {
			if string(key) == n {
				if seen&(1<<i) != 0 {
					return false
				}
				seen |= 1 << i
				return field(i)
			}
		}
		return !foldsTo(key, names) && r.Skip()
	})
}

// foldsTo reports whether key may match one of names case-insensitively. It errs towards yes:
// it also ignores '-' and '_', and a key with a byte outside ASCII may match (Unicode folds 'ſ'
// to 's' and the Kelvin sign to 'k').
func foldsTo(key []byte, names []string) bool {
	var stripped [64]byte
	n := 0
	for _, c := range key {
		switch {
		case c >= utf8.RuneSelf:
			return true
		case c == '-' || c == '_':
			continue
		case n == len(stripped):
			return false // longer than any name
		}
		stripped[n] = c
		n++
	}
	return Fold(stripped[:n], names) != ""
}

// ValidMembers is Valid and Members in one pass: when obj is a valid JSON object whose keys
// have no escape, it calls fn with each member's key and value, in order, and returns true with
// fn's first error. It returns false when it cannot tell (obj is not valid, not an object, or
// has an escaped key or nesting past MaxReaderDepth): the caller then checks obj with Valid and
// walks it with Members. fn may have been called for the members before that point.
func ValidMembers(obj []byte, fn func(key, value []byte) error) (bool, error) {
	r := NewReader(obj)
	var err error
	ok := r.Object(func(key []byte) bool {
		v, ok := r.Raw()
		if ok && err == nil {
			if err = fn(key, v); err != nil {
				err = prefixed(key, err)
			}
		}
		return ok
	})
	if !ok || !r.End() {
		return false, nil
	}
	return true, err
}
