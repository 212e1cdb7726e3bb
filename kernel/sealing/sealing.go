// Package sealing holds the node's server sealing key, the secret that values carehub keeps at
// rest sealed are sealed under (idempotent answers, which can carry API keys and patient data;
// webhook signing secrets).
// The key never enters the database: a reader of the database without it opens nothing.
//
// The key is 32 random bytes, kept base64-encoded in a file (`openssl rand -base64 32`). Every
// node of a deployment must use the same key, or what one node sealed another cannot open.
// Values derive their own keys from it (HKDF-SHA256, one info string per use), so no two uses
// share a key.
package sealing

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Size is the length of a key in bytes.
const Size = 32

// Key is a server sealing key. It is safe for concurrent use.
type Key struct{ raw []byte }

// New returns the key of raw, which must be Size bytes.
func New(raw []byte) (*Key, error) {
	if len(raw) != Size {
		return nil, fmt.Errorf("sealing key: %d bytes, want %d", len(raw), Size)
	}
	return &Key{raw: append([]byte(nil), raw...)}, nil
}

// Random returns a fresh random key.
func Random() *Key {
	raw := make([]byte, Size)
	rand.Read(raw)
	return &Key{raw: raw}
}

// Load reads the key in the file at path: Size bytes, base64-encoded (standard alphabet, with or
// without padding), surrounding whitespace ignored.
func Load(path string) (*Key, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sealing key: %w", err)
	}
	text := strings.TrimRight(strings.TrimSpace(string(b)), "=")
	raw, err := base64.RawStdEncoding.DecodeString(text)
	if err != nil {
		return nil, fmt.Errorf("sealing key %s: not base64 (make one with: openssl rand -base64 32)", path)
	}
	k, err := New(raw)
	if err != nil {
		return nil, fmt.Errorf("%w (file %s; make one with: openssl rand -base64 32)", err, path)
	}
	return k, nil
}

// LoadOrCreate loads the key at path, first writing a random one there (mode 0600, its
// directory 0700 when it is created) when the file does not exist.
func LoadOrCreate(path string) (*Key, error) {
	k, err := Load(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("sealing key: %w", err)
	}
	k = Random()
	if err := k.write(path); err != nil {
		if errors.Is(err, fs.ErrExist) { // another process made it first
			return Load(path)
		}
		return nil, err
	}
	return k, nil
}

// Write writes a random key to path (mode 0600), which must not exist: for tests and operators
// that give several nodes one key.
func Write(path string) error { return Random().write(path) }

func (k *Key) write(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("sealing key: %w", err)
	}
	_, err = f.WriteString(base64.StdEncoding.EncodeToString(k.raw) + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("sealing key: %w", err)
	}
	return nil
}

// Derive returns a 32-byte key for one use (info, which names the use and its version) bound to
// material: HKDF-SHA256 over the server key and material. Without the server key it cannot be
// computed, whatever of material a reader knows or guesses.
func (k *Key) Derive(info string, material []byte) ([]byte, error) {
	ikm := make([]byte, 0, len(k.raw)+len(material))
	ikm = append(append(ikm, k.raw...), material...)
	return hkdf.Key(sha256.New, ikm, nil, info, 32)
}

// AEAD returns AES-256-GCM under the key Derive(info, material) gives.
func (k *Key) AEAD(info string, material []byte) (cipher.AEAD, error) {
	dk, err := k.Derive(info, material)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(dk)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
