package kafka

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Credentials authenticate carehub's clients to brokers that require SASL/SCRAM-SHA-256: the
// embedded broker always does (its credentials are made on its first start and kept under its
// data dir, see EmbeddedCredentials), an external cluster when the operator configures them. The
// zero value authenticates nothing, for brokers that do not ask.
type Credentials struct {
	User     string `json:"user"`
	Password string `json:"password"`
}

// IsZero reports whether c authenticates nothing.
func (c Credentials) IsZero() bool { return c.User == "" && c.Password == "" }

// Validate reports whether c is usable: both parts or neither.
func (c Credentials) Validate() error {
	if (c.User == "") != (c.Password == "") {
		return errors.New("kafka credentials: a SASL user needs a password and a password a user")
	}
	return nil
}

// Opts returns the franz-go options that authenticate with c: none for the zero value.
func (c Credentials) Opts() []kgo.Opt {
	if c.IsZero() {
		return nil
	}
	return []kgo.Opt{kgo.SASL(scram.Auth{User: c.User, Pass: c.Password}.AsSha256Mechanism())}
}

// String never shows the password, so Credentials can sit in a logged config.
func (c Credentials) String() string {
	if c.IsZero() {
		return "none"
	}
	return c.User + ":***"
}

// credentialsFile holds the embedded broker's credentials in its data dir, readable by the
// data dir's owner alone.
const credentialsFile = "carehub.credentials.json"

// embeddedUser is the embedded broker's one SASL user, a superuser: every carehub client of a
// node is the same principal.
const embeddedUser = "carehub"

// EmbeddedCredentials returns the credentials of the embedded broker whose data dir is dir, as
// StartEmbedded made them, so a tool on the same host (carehub's own commands, the load tools)
// can reach a running node's broker. Only the data dir's owner can read them.
func EmbeddedCredentials(dir string) (Credentials, error) {
	b, err := os.ReadFile(filepath.Join(dir, credentialsFile))
	if err != nil {
		return Credentials{}, fmt.Errorf("embedded kafka credentials: %w", err)
	}
	var c Credentials
	if err := json.Unmarshal(b, &c); err != nil || c.IsZero() {
		return Credentials{}, fmt.Errorf("embedded kafka credentials in %s: unreadable", dir)
	}
	return c, nil
}

// embeddedCredentials returns the credentials kept in dir, making them on the first start: a
// random password of 128 bits, written 0600.
func embeddedCredentials(dir string) (Credentials, error) {
	c, err := EmbeddedCredentials(dir)
	if err == nil {
		return c, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return Credentials{}, err
	}
	secret := make([]byte, 16)
	if _, err := rand.Read(secret); err != nil {
		return Credentials{}, fmt.Errorf("embedded kafka credentials: %w", err)
	}
	c = Credentials{User: embeddedUser, Password: hex.EncodeToString(secret)}
	b, _ := json.Marshal(c)
	tmp := filepath.Join(dir, credentialsFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return Credentials{}, fmt.Errorf("embedded kafka credentials: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, credentialsFile)); err != nil {
		return Credentials{}, fmt.Errorf("embedded kafka credentials: %w", err)
	}
	return c, nil
}

// tightenDir makes dir and everything under it private to its owner (directories 0700, files
// 0600). kfake creates its files 0644 in 0755 directories, which would let any local user read
// the records (patient data among them). dir's own 0700 is what protects the files kfake
// creates later (no other user can reach them, whatever their mode); this fixes a data dir made
// before the rule. A process-wide umask would do it for new files too, but it would also close
// the data dir's parents to the postgres account that runs the embedded cluster.
//
// A dir that is 0700 already was made or fixed under the rule, so its files need no walk: the
// walk would only chmod, on every start, the segments kfake made since, which the dir protects.
func tightenDir(dir string) error {
	if fi, err := os.Stat(dir); err == nil && fi.Mode().Perm() == 0o700 {
		return nil
	}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		mode := fs.FileMode(0o600)
		if d.IsDir() {
			mode = 0o700
		}
		if info, err := d.Info(); err == nil && info.Mode().Perm() == mode {
			return nil
		}
		return os.Chmod(path, mode)
	})
}
