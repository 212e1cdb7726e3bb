package egress

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"
	"unicode/utf8"

	"carehub/internal/testenv/rawhttp"
)

func TestGuardRefusesAProtocolSwitch(t *testing.T) {
	url, _ := rawhttp.Serve(t, []byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: rcv\r\nConnection: Upgrade\r\n\r\n"), true)
	client := &http.Client{Transport: Guard(&http.Transport{})}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A plain POST, and one carrying an Upgrade header its owner chose (a FHIR rest-hook's
	// headers are): net/http would hand either the raw connection, outside ctx.
	for _, upgrade := range []string{"", "rcv"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
		if upgrade != "" {
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", upgrade)
		}
		resp, err := client.Do(req)
		if !errors.Is(err, ErrProtocolSwitch) {
			if err == nil {
				resp.Body.Close()
			}
			t.Fatalf("a 101 (Upgrade header %q): err %v, want ErrProtocolSwitch", upgrade, err)
		}
	}
	if _, ok := client.Transport.(interface{ CloseIdleConnections() }); !ok {
		t.Fatal("the guarded transport hides CloseIdleConnections from http.Client")
	}
}

func TestClip(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly", 7, "exactly"},
		{"abcdef", 3, "abc"},
		{"ab\u00e9cd", 3, "ab"},       // é is two bytes: not cut in half
		{"\uFFFD\uFFFD", 4, "\uFFFD"}, // three bytes each
		{"x", 0, ""},
	} {
		got := Clip(tc.in, tc.n)
		if got != tc.want || !utf8.ValidString(got) || len(got) > tc.n {
			t.Errorf("Clip(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}
