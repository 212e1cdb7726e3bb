package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"carehub/kernel/events"
	"carehub/kernel/whsig"
	"carehub/loadtest/loadcli"
	"carehub/processors/webhooks"
)

// rawReport is the baseline: the same number of events, in bodies of the shape carehub delivers
// (docs/WEBHOOKS.md: one event, or an ordered subscription's batch of {id, body}), signed with
// the subscription's secret as each is sent and POSTed straight to a receiver of their own (the
// same verifying tracker) over keep-alive connections, concurrency POSTs at a time. What carehub
// adds is everything else: the publish, Kafka, the delivery's record, claim and outcome.
type rawReport struct {
	Client      string         `json:"client"` // rawNetHTTP or rawFastHTTP
	Events      int            `json:"events"`
	Posts       int            `json:"posts"`
	Concurrency int            `json:"concurrency"`
	Seconds     float64        `json:"seconds"`
	PerSec      float64        `json:"eventsPerSec"`
	Latency     loadcli.MsDist `json:"postMs"`
	Failed      int64          `json:"failed"`
}

// The baseline's clients: Go's own, which carehub's https:// attempts use, and fasthttp's, which
// its plain http:// attempts use (processors/webhooks/plain.go).
const (
	rawNetHTTP  = "net/http"
	rawFastHTTP = "fasthttp"
)

// rawBaseline POSTs n events, size a POST, conc POSTs at a time through client, and reports the
// rate.
func rawBaseline(ctx context.Context, rtls *receiverTLS, client, secret, typ string, n, conc, size int, filler string) (*rawReport, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	tr := newTracker(secret, time.Now, nil)
	srv := &http.Server{Handler: tr, ReadHeaderTimeout: 10 * time.Second}
	go rtls.serve(srv, ln)
	defer srv.Close()
	url := rtls.scheme() + "://" + ln.Addr().String() + "/hook"
	hc := &http.Client{Transport: rtls.transport(conc)}
	defer hc.CloseIdleConnections()
	post := func(id string, body []byte) error { return rawPost(ctx, hc, url, secret, id, body) }
	if client == rawFastHTTP {
		fc := &fasthttp.Client{MaxConnsPerHost: conc, MaxConnWaitTimeout: time.Minute}
		defer fc.CloseIdleConnections()
		post = func(id string, body []byte) error { return rawPostFast(fc, url, secret, id, body) }
	}

	posts := (n + size - 1) / size
	var next atomic.Int64
	var failed atomic.Int64
	lat := make([][]time.Duration, conc)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range conc {
		wg.Go(func() {
			for ctx.Err() == nil {
				p := int(next.Add(1)) - 1
				if p >= posts {
					return
				}
				id, body := rawBody(typ, p, size, min(size, n-p*size), filler)
				t0 := time.Now()
				if err := post(id, body); err != nil {
					failed.Add(1)
					continue
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	got := tr.tally()
	if got.BadSignature+got.Malformed > 0 {
		return nil, fmt.Errorf("the baseline's own receiver refused %d bodies", got.BadSignature+got.Malformed)
	}
	return &rawReport{Client: client, Events: int(got.Delivered), Posts: posts, Concurrency: conc, Seconds: secs,
		PerSec: float64(got.Delivered) / secs, Latency: loadcli.Ms(all), Failed: failed.Load()}, ctx.Err()
}

// rawBody is POST p's webhook-id and body: events p*size.. of the run, k of them, each the body
// carehub delivers for such an event (webhooks.Body), batched as carehub batches
// (webhooks.BatchBody) when size is above 1.
func rawBody(typ string, p, size, k int, filler string) (string, []byte) {
	ids, bodies := make([]string, k), make([][]byte, k)
	for j := range k {
		i := p*size + j
		payload := map[string]any{"client": 0, "seq": i, "sentAt": time.Now().UnixNano()}
		if filler != "" {
			payload["filler"] = filler
		}
		pb, _ := json.Marshal(payload)
		ids[j] = "evt_raw_" + strconv.Itoa(i)
		bodies[j], _ = webhooks.Body(events.Event{Type: typ, OrgID: "org_raw", ProjectID: "prj_raw", Payload: pb, CreatedAt: time.Now()})
	}
	if size == 1 {
		return ids[0], bodies[0]
	}
	return webhooks.BatchBody(ids, bodies)
}

func rawPost(ctx context.Context, hc *http.Client, url, secret, id string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if err := whsig.SetHeaders(req.Header, id, time.Now(), body, secret); err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}

func rawPostFast(fc *fasthttp.Client, url, secret, id string, body []byte) error {
	h := http.Header{}
	if err := whsig.SetHeaders(h, id, time.Now(), body, secret); err != nil {
		return err
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(http.MethodPost)
	req.Header.SetContentType("application/json")
	for k, vs := range h {
		req.Header.Set(k, vs[0])
	}
	req.SetBodyRaw(body)
	if err := fc.Do(req, resp); err != nil {
		return err
	}
	if resp.StatusCode()/100 != 2 {
		return fmt.Errorf("HTTP %d", resp.StatusCode())
	}
	return nil
}
