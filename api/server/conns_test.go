package server

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestReadTimeoutSparesLongHandlers: the read timeout bounds reading the request only. Once the
// body is read, a handler may run past it (an export, a slow query) without its context being
// cancelled: net/http lifts the deadline when it starts its background read (had it kept it,
// the read's timeout would cancel the request's context). A guard on that behaviour.
func TestReadTimeoutSparesLongHandlers(t *testing.T) {
	const timeout = 100 * time.Millisecond
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		select {
		case <-r.Context().Done():
			http.Error(w, "cancelled", http.StatusServiceUnavailable)
		case <-time.After(5 * timeout):
			io.WriteString(w, "done")
		}
	})
	srv := NewHTTPServer(h, HTTPLimits{ReadTimeout: timeout}, slog.New(slog.DiscardHandler), nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(srv.Listener(ln))
	defer srv.Close()

	resp, err := http.Post("http://"+ln.Addr().String()+"/", "text/plain", strings.NewReader("body"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTP %d %s: the handler's context ended with the body deadline", resp.StatusCode, b)
	}
}
