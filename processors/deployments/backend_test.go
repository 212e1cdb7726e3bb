package deployments

import (
	"strings"
	"testing"
	"time"

	"carehub/kernel/sealing"
	"carehub/processors/inference/oip"
)

func TestBackendCheck(t *testing.T) {
	good := BackendInput{Backend: Backend{Protocol: ProtocolOIP, URL: "https://kserve.example.org", Model: "sepsis"}}
	if bad := good.check(false); len(bad) != 0 {
		t.Fatalf("a good backend: %v", bad)
	}
	for _, tc := range []struct {
		change func(*BackendInput)
		field  string
	}{
		{func(b *BackendInput) { b.Protocol = "grpc" }, "backend.protocol"},
		{func(b *BackendInput) { b.URL = "http://kserve.example.org" }, "backend.url"},
		{func(b *BackendInput) { b.URL = "https://127.0.0.1:8080" }, "backend.url"},
		{func(b *BackendInput) { b.URL = "https://user:pw@kserve.example.org" }, "backend.url"},
		{func(b *BackendInput) { b.Model = "" }, "backend.model"},
		{func(b *BackendInput) { b.Authorization = strings.Repeat("x", 5000) }, "backend.authorization"},
	} {
		b := good
		tc.change(&b)
		if bad := b.check(false); bad[tc.field] == "" {
			t.Errorf("%+v: %v, want %s refused", b, bad, tc.field)
		}
	}
	private := good
	private.URL = "http://127.0.0.1:8080"
	if bad := private.check(true); len(bad) != 0 {
		t.Errorf("a private server where allowed: %v", bad)
	}
}

func TestCredentialSealedToItsDeployment(t *testing.T) {
	box := newCredentialBox(sealing.Random())
	sealed := box.seal("dep_1", "Bearer s3cret")
	if strings.Contains(string(sealed), "s3cret") {
		t.Fatal("sealed in clear")
	}
	if got, err := box.open("dep_1", sealed); err != nil || got != "Bearer s3cret" {
		t.Fatalf("open: %q %v", got, err)
	}
	if _, err := box.open("dep_2", sealed); err == nil {
		t.Error("a credential copied to another deployment opens")
	}
	if _, err := newCredentialBox(sealing.Random()).open("dep_1", sealed); err == nil {
		t.Error("another server key opens it")
	}
	if box.seal("dep_1", "") != nil {
		t.Error("no credential seals to something")
	}
}

func TestBreakerOpensAfterFailuresInARow(t *testing.T) {
	r := &remote{}
	now := time.Now()
	down := &oip.TransportError{Method: "POST", URL: "http://x", Err: errBreakerTest}
	for range breakerFailures - 1 {
		r.record(down, now)
	}
	if err := r.allow(now); err != nil {
		t.Fatalf("open after %d failures: %v", breakerFailures-1, err)
	}
	r.record(nil, now) // a success in between starts the count again
	for range breakerFailures {
		r.record(down, now)
	}
	if err := r.allow(now); err == nil {
		t.Fatal("closed after failures in a row")
	}
	if err := r.allow(now.Add(breakerOpen)); err != nil {
		t.Fatalf("still open after %s: %v", breakerOpen, err)
	}
}

var errBreakerTest = &testError{}

type testError struct{}

func (*testError) Error() string { return "connection refused" }
