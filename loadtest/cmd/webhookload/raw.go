package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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
// same verifying tracker) over keep-alive connections, concurrency POSTs at a time, by a sender in
// a process of its own as carehub's is (or, -raw-process shared, in the receiver's). What carehub
// adds is everything else: the publish, Kafka, the delivery's record, claim and outcome.
type rawReport struct {
	Client      string         `json:"client"`  // rawNetHTTP or rawFastHTTP
	Process     string         `json:"process"` // rawOwn or rawShared: where the sender ran
	Events      int            `json:"events"`
	Posts       int            `json:"posts"`
	Concurrency int            `json:"concurrency"`
	Seconds     float64        `json:"seconds"`
	PerSec      float64        `json:"eventsPerSec"`
	Latency     loadcli.MsDist `json:"postMs"`
	Failed      int64          `json:"failed"`
	CPUUs       float64        `json:"cpuUsPerEvent,omitempty"` // the sender's and the receiver's CPU, µs an event
}

// The baseline's clients: Go's own, which carehub's https:// attempts use, and fasthttp's, which
// its plain http:// attempts use (processors/webhooks/plain.go).
const (
	rawNetHTTP  = "net/http"
	rawFastHTTP = "fasthttp"
)

// Where the baseline's sender runs (-raw-process). carehub's node is a process of its own, so
// each of its POSTs wakes the receiver's process from another one. A sender in the receiver's
// process hands each POST from goroutine to goroutine in one scheduler instead, and made 53,600
// POSTs/s where one in a process of its own made 40,700–44,800 in the same half hour (fasthttp,
// 16 at a time, 2 cores): the shared process overstates what a sender can do.
const (
	rawOwn    = "own"
	rawShared = "shared"
)

// rawSenderEnv, set in its environment, makes webhookload the baseline's sender: it reads a
// rawJob on stdin, makes its POSTs and writes a rawResult on stdout (rawSender).
const rawSenderEnv = "WEBHOOKLOAD_RAW_SENDER"

// rawJob is the baseline's POSTs: n events, size a POST, conc POSTs at a time through client to
// url. TLSDir and H1 are the receivers' -tls-dir and -h1 (empty: plain HTTP), from which a
// sender in its own process rebuilds the same TLS and protocols.
type rawJob struct {
	Client string `json:"client"`
	URL    string `json:"url"`
	Secret string `json:"secret"`
	Type   string `json:"type"`
	N      int    `json:"n"`
	Conc   int    `json:"conc"`
	Size   int    `json:"size"`
	Filler string `json:"filler,omitempty"`
	TLSDir string `json:"tlsDir,omitempty"`
	H1     bool   `json:"h1,omitempty"`
}

// rawResult is what the sender measured: Seconds from its first POST to its last answer, the
// POSTs that failed, and the latency of those that did not. Error is why it gave up, if it did.
type rawResult struct {
	Seconds float64        `json:"seconds"`
	Failed  int64          `json:"failed"`
	Latency loadcli.MsDist `json:"postMs"`
	Error   string         `json:"error,omitempty"`
	cpu     time.Duration  // a child sender's CPU, from its exit status (rawInChild)
}

// rawBaseline starts the baseline's receiver, has job's POSTs made to it by a sender in a process
// of its own or, when process is rawShared, in this one, and reports the rate. The receiver's
// tracker counts what arrived, as for carehub's deliveries; the URL and TLS are the receiver's.
func rawBaseline(ctx context.Context, rtls *receiverTLS, process string, job rawJob, logw io.Writer) (*rawReport, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	tr := newTracker(job.Secret, time.Now, nil)
	srv := &http.Server{Handler: tr, ReadHeaderTimeout: 10 * time.Second}
	go rtls.serve(srv, ln)
	defer srv.Close()
	job.URL = rtls.scheme() + "://" + ln.Addr().String() + "/hook"
	if rtls != nil {
		job.TLSDir, job.H1 = filepath.Dir(rtls.certFile), rtls.h1
	}

	var res rawResult
	self := loadcli.ProcessCPU() // the receiver's, and a shared sender's
	if process == rawShared {
		res, err = job.send(ctx, rtls)
	} else {
		res, err = rawInChild(ctx, job, logw)
	}
	if err != nil {
		return nil, err
	}
	cpu := loadcli.ProcessCPU() - self + res.cpu
	got := tr.tally()
	if got.BadSignature+got.Malformed > 0 {
		return nil, fmt.Errorf("the baseline's own receiver refused %d bodies", got.BadSignature+got.Malformed)
	}
	// The sender's own seconds, not the child's lifetime: its start and its JSON are no part of
	// the POSTs it times.
	return &rawReport{Client: job.Client, Process: process, Events: int(got.Delivered), Posts: job.posts(), Concurrency: job.Conc,
		Seconds: res.Seconds, PerSec: float64(got.Delivered) / res.Seconds, Latency: res.Latency, Failed: res.Failed,
		CPUUs: float64(cpu.Microseconds()) / float64(max(got.Delivered, 1))}, ctx.Err()
}

// rawInChild runs job in a child process: webhookload's own binary as rawSender. Its stderr goes
// to logw.
func rawInChild(ctx context.Context, job rawJob, logw io.Writer) (rawResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return rawResult{}, fmt.Errorf("find webhookload's binary for the sender process: %w", err)
	}
	in, err := json.Marshal(job)
	if err != nil {
		return rawResult{}, err
	}
	// On stdin, not in the environment: the job holds the subscription's secret.
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), rawSenderEnv+"=1")
	cmd.Stdin = bytes.NewReader(in)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, logw
	runErr := cmd.Run()
	if ctx.Err() != nil {
		return rawResult{}, ctx.Err()
	}
	var res rawResult
	jsonErr := json.Unmarshal(out.Bytes(), &res)
	switch {
	case jsonErr == nil && res.Error != "": // why it gave up, in its own words
		return rawResult{}, fmt.Errorf("the sender process: %s", res.Error)
	case runErr != nil:
		return rawResult{}, fmt.Errorf("the sender process %s: %w", exe, runErr)
	case jsonErr != nil:
		return rawResult{}, fmt.Errorf("the sender process's result: %w", jsonErr)
	}
	res.cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	return res, nil
}

// rawSender is the child's side of rawInChild: it reads a rawJob from in, makes its POSTs and
// writes the rawResult to out, why it gave up included. It returns the exit status: 1 when it
// gave up.
func rawSender(in io.Reader, out io.Writer) int {
	res, err := runRawJob(in)
	if err != nil {
		res.Error = err.Error()
	}
	if werr := json.NewEncoder(out).Encode(res); werr != nil || err != nil {
		return 1
	}
	return 0
}

func runRawJob(in io.Reader) (rawResult, error) {
	var job rawJob
	if err := json.NewDecoder(in).Decode(&job); err != nil {
		return rawResult{}, fmt.Errorf("read the job: %w", err)
	}
	var rtls *receiverTLS
	if job.TLSDir != "" {
		var err error
		if rtls, err = loadReceiverTLS(job.TLSDir, job.H1); err != nil {
			return rawResult{}, err
		}
	}
	// No signal handling: an interrupt stops the parent's run too, and it discards the baseline.
	return job.send(context.Background(), rtls)
}

// posts is how many POSTs carry the job's events.
func (j rawJob) posts() int { return (j.N + j.Size - 1) / j.Size }

// send makes job's POSTs, TLS as rtls says, and measures them. Both -raw-process modes run it.
// It fails only when not one POST succeeded: there is then no rate to compare with.
func (j rawJob) send(ctx context.Context, rtls *receiverTLS) (rawResult, error) {
	if j.N < 1 || j.Conc < 1 || j.Size < 1 || j.Client != rawNetHTTP && j.Client != rawFastHTTP {
		return rawResult{}, fmt.Errorf("a job of %d events, %d a POST, %d at a time through %q", j.N, j.Size, j.Conc, j.Client)
	}
	hc := &http.Client{Transport: rtls.transport(j.Conc)}
	defer hc.CloseIdleConnections()
	post := func(id string, body []byte) error { return rawPost(ctx, hc, j.URL, j.Secret, id, body) }
	if j.Client == rawFastHTTP {
		fc := &fasthttp.Client{MaxConnsPerHost: j.Conc, MaxConnWaitTimeout: time.Minute}
		defer fc.CloseIdleConnections()
		post = func(id string, body []byte) error { return rawPostFast(fc, j.URL, j.Secret, id, body) }
	}

	posts := j.posts()
	var next, failed atomic.Int64
	var firstErr atomic.Value
	lat := make([][]time.Duration, j.Conc)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range j.Conc {
		wg.Go(func() {
			for ctx.Err() == nil {
				p := int(next.Add(1)) - 1
				if p >= posts {
					return
				}
				id, body := rawBody(j.Type, p, j.Size, min(j.Size, j.N-p*j.Size), j.Filler)
				t0 := time.Now()
				if err := post(id, body); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
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
	res := rawResult{Seconds: secs, Failed: failed.Load(), Latency: loadcli.Ms(all)}
	if len(all) == 0 && ctx.Err() == nil {
		return res, fmt.Errorf("none of %d POSTs to %s succeeded; the first: %v", posts, j.URL, firstErr.Load())
	}
	return res, nil
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
