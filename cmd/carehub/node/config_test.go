package node

import (
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"carehub/internal/testenv"
)

// The Makefile's DATA_DIR and the commands' --data-dir default are one value: a key made with
// `bin/carehub keys create` (no --data-dir) must land in the database `make run` serves.
func TestMakefileDataDir(t *testing.T) {
	mk, err := os.ReadFile("../../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^DATA_DIR\s*\?=\s*(\S+)\s*$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile: no `DATA_DIR ?= …` line")
	}
	if got := string(m[1]); got != DefaultDataDir {
		t.Errorf("Makefile DATA_DIR = %s, commands default to %s", got, DefaultDataDir)
	}
	if got := Defaults().DataDir; got != DefaultDataDir {
		t.Errorf("Defaults().DataDir = %s, want %s", got, DefaultDataDir)
	}
}

// --webhooks-ca-file adds its authorities to the system's; a file that cannot be read or holds
// no certificate stops the node at start rather than failing every delivery later.
func TestWebhookRoots(t *testing.T) {
	if roots, err := (&Config{}).webhookRoots(); roots != nil || err != nil {
		t.Errorf("no file: %v, %v; want the system's (nil)", roots, err)
	}
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	good, _ := testenv.TLSFiles(t, srv)
	dir := t.TempDir()
	roots, err := (&Config{WebhooksCAFile: good}).webhookRoots()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Certificate().Verify(x509.VerifyOptions{Roots: roots}); err != nil {
		t.Errorf("the file's authority is not trusted: %v", err)
	}
	garbage := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{garbage, filepath.Join(dir, "missing.pem")} {
		if _, err := (&Config{WebhooksCAFile: path}).webhookRoots(); err == nil || !strings.Contains(err.Error(), "--webhooks-ca-file") {
			t.Errorf("%s: %v, want an error naming the flag", path, err)
		}
	}
}
