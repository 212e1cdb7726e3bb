package idempotency

import (
	"bytes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/gob"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"carehub/kernel/access"
	"carehub/kernel/sealing"
)

// MaxKeyLength bounds an Idempotency-Key.
const MaxKeyLength = 255

// ValidKey reports whether k is a usable Idempotency-Key: 1 to MaxKeyLength visible ASCII
// characters (0x21 to 0x7e; no spaces, control characters or non-ASCII bytes).
func ValidKey(k string) bool {
	if len(k) == 0 || len(k) > MaxKeyLength {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// Scope is whose key it is: the credential's organization ("" for the platform operator) and
// its API key id (a JWT's parent key). The same key string under two scopes names two keys.
type Scope struct {
	OrgID, KeyID string
	// Grant is what the credential may do and see (GrantOf). It is part of the request: an
	// answer is replayed, and a dead request's claim taken over, only for a credential with the
	// same grant, whose own authorization therefore passed already. A narrower credential of
	// the same key (a JWT scoped down, a key whose scopes were cut) gets ErrMismatch instead of
	// an answer its own checks would refuse.
	Grant string
}

// ScopeOf is the scope of p's keys.
func ScopeOf(p *access.Principal) Scope {
	return Scope{OrgID: p.OrgID, KeyID: p.KeyID, Grant: GrantOf(p)}
}

// GrantOf names what p may do and see: every scope check and patient-data rule of a request
// depends on these only (besides its organization and key, which the scope holds).
func GrantOf(p *access.Principal) string {
	if p.Platform {
		return "platform"
	}
	scopes := slices.Clone(p.Scopes)
	slices.Sort(scopes)
	return p.Mode + " " + strings.Join(slices.Compact(scopes), " ")
}

// bind makes a request's hash also name the grant it runs under.
func bind(requestHash []byte, grant string) []byte {
	h := sha256.New()
	h.Write(requestHash)
	h.Write([]byte{0})
	h.Write([]byte(grant))
	return h.Sum(nil)
}

// keys are what a key and its scope derive: the row's lookup hash and the sealing cipher.
type keys struct {
	lookup []byte
	aead   cipher.AEAD
}

// derive derives key's keys under scope. The lookup hash needs no secret: it only finds the row.
// The sealing key is also derived from the server key, so a reader of the database who guesses
// the Idempotency-Key still opens nothing (v1 seals lacked it: they no longer open, ErrUnreadable).
func derive(server *sealing.Key, s Scope, key string) (keys, error) {
	salt := []byte(s.OrgID + "\x00" + s.KeyID)
	lookup, err := hkdf.Key(sha256.New, []byte(key), salt, "carehub idempotency lookup v1", 32)
	if err != nil {
		return keys{}, err
	}
	aead, err := server.AEAD("carehub idempotency seal v2", append(append(salt, 0), key...))
	if err != nil {
		return keys{}, err
	}
	return keys{lookup: lookup, aead: aead}, nil
}

// seal encrypts plain with a random nonce; ad binds it to its place (a step number, the
// answer), so a sealed value moved elsewhere in the table does not open.
func (k keys) seal(plain []byte, ad string) []byte {
	nonce := make([]byte, k.aead.NonceSize(), k.aead.NonceSize()+len(plain)+k.aead.Overhead())
	rand.Read(nonce)
	return k.aead.Seal(nonce, nonce, plain, []byte(ad))
}

func (k keys) open(sealed []byte, ad string) ([]byte, error) {
	n := k.aead.NonceSize()
	if len(sealed) < n {
		return nil, ErrUnreadable
	}
	plain, err := k.aead.Open(nil, sealed[:n], sealed[n:], []byte(ad))
	if err != nil {
		return nil, ErrUnreadable
	}
	return plain, nil
}

// encode records *out (out is a pointer) with gob, which keeps every exported field whatever
// its JSON tags say, under the name of its type, which decode checks.
func encode(out any) ([]byte, error) {
	v := reflect.ValueOf(out)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return nil, fmt.Errorf("record %T: not a non-nil pointer", out)
	}
	box := reflect.New(boxType(v.Elem().Type())).Elem()
	box.Field(0).Set(v.Elem())
	var buf bytes.Buffer
	enc := gob.NewEncoder(&buf)
	if err := enc.Encode(struct{ Type string }{typeName(out)}); err != nil {
		return nil, err
	}
	if err := enc.Encode(box.Interface()); err != nil {
		return nil, fmt.Errorf("record %T: %w", out, err)
	}
	return buf.Bytes(), nil
}

// decode restores into out what encode recorded of a value of the same type. gob leaves out
// empty slices and maps, so they come back nil; decode makes them empty again, which is what
// the services' values hold (pgx scans an empty array as an empty slice).
func decode(b []byte, out any) error {
	v := reflect.ValueOf(out)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return fmt.Errorf("restore %T: not a non-nil pointer", out)
	}
	dec := gob.NewDecoder(bytes.NewReader(b))
	var head struct{ Type string }
	if err := dec.Decode(&head); err != nil {
		return fmt.Errorf("restore %T: %w", out, err)
	}
	if head.Type != typeName(out) {
		return fmt.Errorf("%w: step recorded a %s, this request's step returns a %s", ErrDiverged, head.Type, typeName(out))
	}
	box := reflect.New(boxType(v.Elem().Type()))
	if err := dec.Decode(box.Interface()); err != nil {
		return fmt.Errorf("restore %T: %w", out, err)
	}
	emptyNotNil(box.Elem().Field(0))
	v.Elem().Set(box.Elem().Field(0))
	return nil
}

// boxType is struct{V t}: gob encodes a nil pointer inside a struct (as absent), not at the top.
func boxType(t reflect.Type) reflect.Type {
	return reflect.StructOf([]reflect.StructField{{Name: "V", Type: t}})
}

func typeName(out any) string { return fmt.Sprintf("%T", out) }

// emptyNotNil replaces nil slices (but byte slices: json.RawMessage's nil means absent) and nil
// maps reachable from v with empty ones.
func emptyNotNil(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			emptyNotNil(v.Elem())
		}
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				emptyNotNil(v.Field(i))
			}
		}
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return
		}
		if v.IsNil() {
			if v.CanSet() {
				v.Set(reflect.MakeSlice(v.Type(), 0, 0))
			}
			return
		}
		for i := 0; i < v.Len(); i++ {
			emptyNotNil(v.Index(i))
		}
	case reflect.Map:
		if v.IsNil() && v.CanSet() {
			v.Set(reflect.MakeMap(v.Type()))
		}
	}
}
