package kafka_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage/kafka"
)

// The embedded broker answers only clients that authenticate with its credentials: another
// local process (any user of the host reaches a loopback port) can neither list its topics nor
// produce to them (issue 51, finding 5).
func TestEmbeddedRefusesUnauthenticatedClients(t *testing.T) {
	dir := t.TempDir()
	e := startEmbedded(t, dir, kafka.EmbeddedConfig{})
	if err := kafka.EnsureTopics(timeout(t, 10*time.Second), embeddedClient(t, e), kafka.Layout{Partitions: 1}, "phi"); err != nil {
		t.Fatalf("an authenticated client: %v", err)
	}

	for name, creds := range map[string]kafka.Credentials{
		"anonymous":      {},
		"wrong password": {User: e.Credentials().User, Password: "guess"},
	} {
		t.Run(name, func(t *testing.T) {
			cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(e.Addrs()...), kgo.RequestRetries(0)}, creds.Opts()...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if topics, err := kadm.NewClient(cl).ListTopics(ctx); err == nil && topics.Has("phi") {
				t.Fatalf("listed the topics: %v", topics.Names())
			}
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "phi", Value: []byte(`{"forged":true}`)}).FirstErr(); err == nil {
				t.Fatal("produced a record")
			}
		})
	}

	// The credentials survive a restart, so tools on the host that read them keep working.
	creds := e.Credentials()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := kafka.EmbeddedCredentials(dir); err != nil || got != creds {
		t.Fatalf("EmbeddedCredentials after close = %v, %v; want %v", got, err, creds)
	}
	e2 := startEmbedded(t, dir, kafka.EmbeddedConfig{})
	if e2.Credentials() != creds {
		t.Fatalf("credentials changed across a restart")
	}
	if err := kafka.EnsureTopics(timeout(t, 10*time.Second), embeddedClient(t, e2), kafka.Layout{Partitions: 1}, "phi"); err != nil {
		t.Fatalf("an authenticated client after a restart: %v", err)
	}
}

// The data dir is its owner's alone: 0700, and whatever was in it from before this rule (kfake
// writes 0644 files in 0755 dirs) is made 0700/0600 on start.
func TestEmbeddedDataDirIsPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "kafka")
	if err := os.MkdirAll(filepath.Join(dir, "old-topic-0"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "old-topic-0", "0.log"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	e := startEmbedded(t, dir, kafka.EmbeddedConfig{})
	if err := kafka.EnsureTopics(timeout(t, 10*time.Second), embeddedClient(t, e), kafka.Layout{Partitions: 1}, "phi"); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil { // writes kfake's state files
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("data dir mode %v (%v), want 0700", fi.Mode().Perm(), err)
	}
	_ = filepath.WalkDir(filepath.Join(dir, "old-topic-0"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		info, _ := d.Info()
		want := fs.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		}
		if info.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, info.Mode().Perm(), want)
		}
		return nil
	})
	if fi, err := os.Stat(filepath.Join(dir, "carehub.credentials.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("credentials file: %v, %v; want 0600", fi, err)
	}
}
