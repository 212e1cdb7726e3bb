package loadtest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"time"
)

// bareHTTP posts the same bodies, from the same number of devices, to a loopback HTTP server
// that only reads each body and answers 202, for the raw phase: what HTTP itself costs on this
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

	n, perSecond, err := everyDevice(ctx, cfg, func(ctx context.Context, d, i int) (int64, error) {
		b := bodies[(d+i*cfg.Devices)%len(bodies)]
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(b.data))
		req.Header.Set("Content-Type", b.contentType)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return 0, errors.New(resp.Status)
		}
		return int64(b.count), nil
	})
	if err != nil {
		return err
	}
	rep.BareHTTPObservations, rep.BareHTTPPerSecond = n, perSecond
	if perSecond > 0 {
		rep.AcceptedToBareHTTPRatio = rep.AcceptedPerSecond / perSecond
	}
	return nil
}
