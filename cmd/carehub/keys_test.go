package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestKeysCommand runs `carehub keys` in process against the embedded Postgres of a data dir,
// as an operator would between server runs.
func TestKeysCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded Postgres per command")
	}
	dir := dataDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	carehub := func(args ...string) (int, string, string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := run(ctx, args, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	if code, _, stderr := carehub("seed", "--data-dir", dir); code != 0 {
		t.Fatalf("seed: %d %s", code, stderr)
	}

	code, out, stderr := carehub("keys", "create", "--data-dir", dir, "--org", "demo-health", "--mode", "test",
		"--scopes", "read:patients,exec:agents", "--ip", "10.0.0.0/8,::ffff:192.0.2.1", "--name", "ci", "--json")
	if code != 0 {
		t.Fatalf("keys create: %d %s", code, stderr)
	}
	var created struct {
		ID, Key, OrgID, Mode string
		Scopes               []string
	}
	if err := json.Unmarshal([]byte(out), &created); err != nil || !strings.HasPrefix(created.Key, "chk_test_") || len(created.Key) != 41 ||
		created.Mode != "test" || strings.Join(created.Scopes, ",") != "exec:agents,read:patients" {
		t.Fatalf("keys create printed %s (%v)", out, err)
	}

	list := func() []map[string]any {
		t.Helper()
		code, out, stderr := carehub("keys", "list", "--data-dir", dir, "--org", "demo-health", "--json")
		if code != 0 {
			t.Fatalf("keys list: %d %s", code, stderr)
		}
		if strings.Contains(out, created.Key[len("chk_test_"):]) {
			t.Fatal("keys list shows a secret")
		}
		var keys []map[string]any
		if err := json.Unmarshal([]byte(out), &keys); err != nil {
			t.Fatal(err)
		}
		return keys
	}
	status := func(id string) string {
		for _, k := range list() {
			if k["id"] == id {
				return k["status"].(string)
			}
		}
		t.Fatalf("key %s not listed", id)
		return ""
	}
	keys := list()
	if len(keys) != 1 || keys[0]["masked"] != "chk_test_…"+created.Key[len(created.Key)-4:] ||
		strings.Join(toStrings(keys[0]["ipAllowlist"]), ",") != "10.0.0.0/8,192.0.2.1/32" {
		t.Fatalf("keys list: %v", keys)
	}

	code, out, stderr = carehub("keys", "rotate", "--data-dir", dir, "--json", created.ID)
	var rotated struct{ ID, Key string }
	if code != 0 || json.Unmarshal([]byte(out), &rotated) != nil || rotated.ID == created.ID || rotated.Key == created.Key {
		t.Fatalf("keys rotate: %d %s %s", code, out, stderr)
	}
	if s := status(created.ID); s != "rotated" {
		t.Fatalf("rotated key has status %s", s)
	}
	code, out, stderr = carehub("keys", "revoke", "--data-dir", dir, rotated.ID)
	if code != 0 || !strings.Contains(out, "revoked "+rotated.ID) {
		t.Fatalf("keys revoke: %d %s %s", code, out, stderr)
	}
	if s := status(rotated.ID); s != "revoked" {
		t.Fatalf("revoked key has status %s", s)
	}

	code, out, _ = carehub("keys", "create", "--data-dir", dir, "--platform", "--json")
	if code != 0 || !strings.Contains(out, `"platform":true`) || !strings.Contains(out, `"key":"chk_live_`) {
		t.Fatalf("platform key: %d %s", code, out)
	}

	for _, tc := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"keys", "create", "--data-dir", dir, "--org", "demo-health", "--mode", "test", "--scopes", "read:everything"}, 1, "scopes: unknown scope"},
		{[]string{"keys", "create", "--data-dir", dir, "--org", "no-such-org", "--mode", "test"}, 1, "not found"},
		{[]string{"keys", "create", "--data-dir", dir, "--org", "demo-health"}, 1, "--mode must be live or test"},
		{[]string{"keys", "revoke", "--data-dir", dir, "key_nope"}, 1, "not found"},
		{[]string{"keys"}, 2, "Usage"},
		{[]string{"keys", "rotate", "--data-dir", dir}, 2, "Usage"},
		{[]string{"keys", "explode"}, 2, "unknown subcommand"},
	} {
		code, _, stderr := carehub(tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.stderr) {
			t.Errorf("carehub %v: %d %q, want %d and %q", tc.args, code, stderr, tc.code, tc.stderr)
		}
	}
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}
