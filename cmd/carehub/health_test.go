package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestHealthCommand is the image's HEALTHCHECK: exit 0 on 200 only.
func TestHealthCommand(t *testing.T) {
	var status atomic.Int32 // read by the server's goroutines
	status.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()

	if out, stderr, code := runCLI(t, "health", "--url", srv.URL+"/healthz"); code != 0 || strings.TrimSpace(out) != "ok" {
		t.Fatalf("healthy: exit %d, %q %q", code, out, stderr)
	}
	status.Store(http.StatusServiceUnavailable)
	if _, stderr, code := runCLI(t, "health", "--url", srv.URL+"/healthz"); code != 1 || !strings.Contains(stderr, "503") {
		t.Fatalf("unhealthy: exit %d, %q", code, stderr)
	}
	srv.Close()
	if _, stderr, code := runCLI(t, "health", "--url", srv.URL+"/healthz"); code != 1 || !strings.Contains(stderr, "refused") {
		t.Fatalf("no server: exit %d, %q", code, stderr)
	}
}
