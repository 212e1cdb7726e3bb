package loadtest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// bareHTTP posts the same bodies, from the same number of devices, to a loopback HTTP server
// that only reads each body and answers 202, for Duration: what HTTP itself costs on this
// machine, the ceiling of any intake behind it.
func bareHTTP(ctx context.Context, cfg Config, client *http.Client, bodies []body, rep *Report) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{"accepted":0,"rejected":[],"ids":[]}`))
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	target := "http://" + ln.Addr().String() + "/v1/observations"

	pctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	var acked atomic.Int64
	var firstErr atomic.Value
	start := time.Now()
	var wg sync.WaitGroup
	for d := range cfg.Devices {
		wg.Go(func() {
			for i := 0; pctx.Err() == nil; i++ {
				b := bodies[(d+i*cfg.Devices)%len(bodies)]
				req, _ := http.NewRequestWithContext(pctx, http.MethodPost, target, bytes.NewReader(b.data))
				req.Header.Set("Content-Type", b.contentType)
				resp, err := client.Do(req)
				if err != nil {
					if pctx.Err() == nil {
						firstErr.CompareAndSwap(nil, err)
					}
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted {
					firstErr.CompareAndSwap(nil, errors.New(resp.Status))
					return
				}
				acked.Add(int64(b.count))
			}
		})
	}
	wg.Wait()
	if err, ok := firstErr.Load().(error); ok {
		return err
	}
	rep.BareHTTPObservations = acked.Load()
	rep.BareHTTPPerSecond = float64(rep.BareHTTPObservations) / time.Since(start).Seconds()
	if rep.BareHTTPPerSecond > 0 {
		rep.AcceptedToBareHTTPRatio = rep.AcceptedPerSecond / rep.BareHTTPPerSecond
	}
	return nil
}
