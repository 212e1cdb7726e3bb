// Package rawhttp is a receiver for tests that answers HTTP requests with bytes of the test's
// choosing: the malformed, hostile or unending answers net/http's server will not send, which
// carehub's clients of receivers (webhooks, FHIR rest-hooks, inference servers) must survive.
package rawhttp

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Serve starts a receiver on loopback that reads each request whole and answers it with answer.
// With hold it then keeps the connection open and silent until the test ends; without, it reads
// the next request on the connection (for 30 s at most). It returns the receiver's URL and how
// many answers it has sent.
func Serve(t testing.TB, answer []byte, hold bool) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	answered := new(atomic.Int64)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				if !hold {
					_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				}
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					if _, err := c.Write(answer); err != nil {
						return
					}
					answered.Add(1)
					if hold {
						<-t.Context().Done()
						return
					}
				}
			})
		}
	})
	return "http://" + ln.Addr().String() + "/hook", answered
}
