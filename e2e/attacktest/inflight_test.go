package attacktest

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"carehub/cmd/carehub/node"
	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// TestRequestsInProgressCappedPerKey: finding 2's per-key bound. Within the read timeout one key
// could still hold as many connections as it opened, each a request whose body arrives a byte
// at a time; a key has at most --max-in-flight-per-key requests in progress, the next is 429 at
// once, and other keys are served meanwhile.
func TestRequestsInProgressCappedPerKey(t *testing.T) {
	const max = 3
	s := servertest.Start(t, func(c *node.Config) { c.MaxInFlightPerKey = max })
	slow := s.Key(demo.DemoOrgSlug, access.Live, access.ExecWorkflows)
	other := s.Key(demo.DemoOrgSlug, access.Live, access.ExecWorkflows)

	hold := func() net.Conn {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, "POST /v1/events HTTP/1.1\r\nHost: carehub\r\nAuthorization: Bearer "+slow+
			"\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{"); err != nil {
			t.Fatal(err)
		}
		return c
	}
	held := make([]net.Conn, max)
	for i := range held {
		held[i] = hold()
	}
	// The held requests are counted once their handlers run. A probe that gets in first takes a
	// place and one of them is refused at once: that one is sent again.
	servertest.Eventually(t, 30*time.Second, "the key's next request refused while its slow ones are in progress", func() bool {
		for i, c := range held {
			_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
			if n, err := c.Read(make([]byte, 1)); n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
				c.Close()
				held[i] = hold()
			}
		}
		r := s.Do(http.MethodGet, "/v1/organizations", slow, nil)
		// The rate limit's 429 says otherwise: this one must be the bound on requests in progress.
		return r.Status == http.StatusTooManyRequests && r.Header.Get("Retry-After") != "" &&
			strings.Contains(string(r.Body), "in progress")
	})
	if r := s.Do(http.MethodGet, "/v1/organizations", other, nil); r.Status != http.StatusOK {
		t.Fatalf("another key of the same organization: %d %s", r.Status, r.Body)
	}
	for _, c := range held {
		c.Close()
	}
	servertest.Eventually(t, 30*time.Second, "the key served again once its slow requests ended", func() bool {
		return s.Do(http.MethodGet, "/v1/organizations", slow, nil).Status == http.StatusOK
	})
}
