package webhooks

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"carehub/internal/testenv/rawhttp"
	"carehub/kernel/egress"
	"carehub/kernel/whsig"
)

// TestSendKeepsWhatWentWrongNotWhatTheReceiverSent: an attempt's error and excerpt are stored and
// served; a receiver that answers garbage must not put its bytes (or megabytes of them) there.
func TestSendKeepsWhatWentWrongNotWhatTheReceiverSent(t *testing.T) {
	s := newSender(true, 5*time.Second, 1, nil)
	defer s.close()
	for _, tc := range []struct {
		name, answer string
		status       int
		err          string
	}{
		{"malformed status line", "HTTP/1.1 2x0 \x00\xffOK\r\nContent-Length: 0\r\n\r\n", 0, "malformed HTTP status code"},
		{"not HTTP", "\x00\xff\xfe SSH-2.0-rcv\r\n\r\n", 0, "malformed HTTP"},
		{"long header line", "HTTP/1.1 200 OK\r\nX" + strings.Repeat("\x00\xffA", 10<<10) + "\r\n\r\n", 0, "malformed HTTP header"},
		{"headers over the limit", "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("h", 100<<10) + "\r\n\r\n", 0, "headers exceeded"},
		{"protocol switch", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: rcv\r\nConnection: Upgrade\r\n\r\n", 0, "switched protocols"},
		{"redirect", "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:1/\r\nContent-Length: 0\r\n\r\n", 302, "redirect not followed"},
		{"invalid UTF-8 over the whole excerpt", "HTTP/1.1 422 No\r\nContent-Length: 4096\r\n\r\n" + strings.Repeat("\xffa", 2048), 422, "HTTP 422"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			url, _ := rawhttp.Serve(t, []byte(tc.answer), false)
			t.Cleanup(s.close) // before the receiver's: it waits for the connection kept alive
			out := s.send(ctx, url, "evt_1", []byte(`{}`), []string{whsig.NewSecret()})
			if out.StatusCode != tc.status || !strings.Contains(out.Err, tc.err) {
				t.Fatalf("status %d, error %.200q; want %d and an error naming %q", out.StatusCode, out.Err, tc.status, tc.err)
			}
			for what, text := range map[string]string{"error": out.Err, "excerpt": out.ResponseBody} {
				if !utf8.ValidString(text) || strings.ContainsAny(text, "\x00\"") || strings.Contains(text, `\x`) {
					t.Errorf("%s %.200q echoes the receiver's bytes", what, text)
				}
			}
			if len(out.Err) > egress.MaxErrorText || len(out.ResponseBody) > responseBodyLimit {
				t.Errorf("error of %d bytes, excerpt of %d: over %d and %d", len(out.Err), len(out.ResponseBody), egress.MaxErrorText, responseBodyLimit)
			}
		})
	}
}

// TestSendRefusesURLsItCannotPost: a URL that does not parse, or is not http(s) with a host, is
// a failed attempt named as such, and is not kept among the parsed ones.
func TestSendRefusesURLsItCannotPost(t *testing.T) {
	s := newSender(true, 5*time.Second, 1, nil)
	defer s.close()
	for _, u := range []string{"ftp://127.0.0.1/x", "http://", "127.0.0.1:80/x", "http://127.0.0.1:80/%zz"} {
		if out := s.send(context.Background(), u, "evt_1", []byte(`{}`), []string{whsig.NewSecret()}); out.Err != "bad url" {
			t.Errorf("%s: error %q, want bad url", u, out.Err)
		}
	}
	if n := s.nurls.Load(); n != 2 {
		t.Errorf("%d URLs kept, want the 2 that parse", n)
	}
}
