package oip

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"carehub/models"
	"carehub/processors/inference/oip/mlservertest"
)

// These tests run a real MLServer (mlservertest: tests/mlserver) serving models/demo's
// deterioration model through MLServer's scikit-learn runtime. They need the venv that
// tests/mlserver/setup.sh makes; without it, or with a stale one, they fail and name the
// setup command.
//
// One server is shared by the tests and benchmarks of this process (started on first use,
// stopped by TestMain); TestMLServerKillRestart starts its own.

const demoModel = mlservertest.Model

func TestMain(m *testing.M) {
	code := m.Run()
	stopShared()
	os.Exit(code)
}

var (
	sharedMu       sync.Mutex
	sharedSrv      *mlservertest.Server
	sharedTried    bool
	sharedCleanups []func()
)

// sharedTB is the testing.TB the shared server is started with: that of the first test to
// use it, except that its cleanups are kept for TestMain (stopShared) rather than run when
// that test ends.
type sharedTB struct{ testing.TB }

func (sharedTB) Cleanup(f func()) { sharedCleanups = append(sharedCleanups, f) } // under sharedMu

// sharedServer is the process's MLServer, started on first use.
func sharedServer(tb testing.TB) *mlservertest.Server {
	tb.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedSrv == nil {
		if sharedTried {
			tb.Fatal("the shared MLServer failed to start in an earlier test")
		}
		sharedTried = true
		sharedSrv = mlservertest.Start(sharedTB{tb})
	}
	return sharedSrv
}

func stopShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	for _, f := range slices.Backward(sharedCleanups) {
		f()
	}
	sharedCleanups, sharedSrv = nil, nil
}

// float32s is xs as the FP32 data of a tensor.
func float32s(xs []float64) []float32 {
	out := make([]float32, len(xs))
	for i, x := range xs {
		out[i] = float32(x)
	}
	return out
}

func newClient(tb testing.TB, cfg Config) *Client {
	tb.Helper()
	c, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func TestMLServerReadyAndMetadata(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	for _, version := range []string{"", "1"} {
		c := newClient(t, Config{BaseURL: s.URL, Model: demoModel, Version: version})
		if err := c.Ready(ctx); err != nil {
			t.Fatalf("version %q: Ready: %v", version, err)
		}
		m, err := c.Metadata(ctx)
		if err != nil {
			t.Fatalf("version %q: Metadata: %v", version, err)
		}
		want := Metadata{
			Name: demoModel, Versions: []string{"1"}, Platform: "sklearn",
			Inputs:  []TensorMetadata{{Name: "vitals", Datatype: "FP32", Shape: []int64{-1, 5}}},
			Outputs: []TensorMetadata{{Name: "predict_proba", Datatype: "FP64", Shape: []int64{-1, 2}}},
		}
		if fmt.Sprint(m) != fmt.Sprint(want) {
			t.Errorf("version %q: Metadata = %+v, want %+v", version, m, want)
		}
	}
}

func TestMLServerInferExpected(t *testing.T) {
	s := sharedServer(t)
	cases, tol := models.DeteriorationCases()
	ctx := context.Background()
	c := newClient(t, Config{BaseURL: s.URL, Model: demoModel, Version: "1",
		Header: http.Header{"Authorization": {"Bearer test-token"}}}) // MLServer ignores it
	if _, err := c.Metadata(ctx); err != nil { // turns on the input checks
		t.Fatal(err)
	}
	maxDiff := 0.0
	check := func(name string, got float32, want float64) {
		d := math.Abs(float64(got) - want)
		maxDiff = max(maxDiff, d)
		if d > tol {
			t.Errorf("%s: P(deterioration) = %v, want %v (±%g)", name, got, want, tol)
		}
	}
	// Batch 1, row by row.
	for _, cs := range cases {
		out, err := c.Infer(ctx, []Tensor{{Name: "vitals", Datatype: "FP32", Shape: []int64{1, 5}, Data: float32s(cs.Input)}})
		if err != nil {
			t.Fatalf("%s: %v", cs.Name, err)
		}
		if len(out) != 1 || out[0].Name != "predict_proba" || out[0].Datatype != "FP64" || !slices.Equal(out[0].Shape, []int64{1, 2}) {
			t.Fatalf("%s: outputs %+v, want one predict_proba FP64 [1 2]", cs.Name, out)
		}
		if s := out[0].Data[0] + out[0].Data[1]; math.Abs(float64(s)-1) > 1e-6 {
			t.Errorf("%s: probabilities sum to %v", cs.Name, s)
		}
		check(cs.Name, out[0].Data[1], cs.Output)
	}
	// One batch of every row.
	var data []float32
	for _, cs := range cases {
		data = append(data, float32s(cs.Input)...)
	}
	n := int64(len(cases))
	out, err := c.Infer(ctx, []Tensor{{Name: "vitals", Shape: []int64{n, 5}, Data: data}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || !slices.Equal(out[0].Shape, []int64{n, 2}) {
		t.Fatalf("batch: outputs %+v, want one [%d 2]", out, n)
	}
	for i, cs := range cases {
		check("batch "+cs.Name, out[0].Data[2*i+1], cs.Output)
	}
	t.Logf("%d cases, batch 1 and batch %d: max |MLServer - onnxruntime| = %.2g (tolerance %g)", n, n, maxDiff, tol)
}

func TestMLServerUnknownModel(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := newClient(t, Config{BaseURL: s.URL, Model: "no-such-model"})
	_, err := c.Infer(ctx, []Tensor{{Name: "vitals", Shape: []int64{1, 5}, Data: make([]float32, 5)}})
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusNotFound || se.Message != "Model no-such-model not found" {
		t.Fatalf("Infer on an unknown model: %v, want a 404 StatusError with MLServer's message", err)
	}
	if !strings.Contains(err.Error(), "404 Not Found: Model no-such-model not found") {
		t.Errorf("error text %q does not say the status and the server's message", err)
	}
	if Retryable(err) {
		t.Errorf("Retryable(%v) = true, want false", err)
	}
	t.Logf("unknown model: %v", err)

	err = c.Ready(ctx)
	if !errors.Is(err, ErrNotReady) || !errors.As(err, &se) || se.StatusCode != http.StatusNotFound || Retryable(err) {
		t.Errorf("Ready on an unknown model: %v, want ErrNotReady with a non-retryable 404", err)
	}
	if _, err := c.Metadata(ctx); !errors.As(err, &se) || se.StatusCode != http.StatusNotFound {
		t.Errorf("Metadata on an unknown model: %v, want a 404", err)
	}
}

func TestMLServerWrongShape(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := newClient(t, Config{BaseURL: s.URL, Model: demoModel})

	// Data that does not fill the shape never leaves the client.
	_, err := c.Infer(ctx, []Tensor{{Name: "vitals", Shape: []int64{1, 5}, Data: []float32{72, 14, 98, 125}}})
	if !errors.Is(err, ErrInvalidInput) || Retryable(err) || !strings.Contains(err.Error(), "shape [1 5] holds 5 values, data has 4") {
		t.Errorf("short data: %v, want a non-retryable ErrInvalidInput naming shape and length", err)
	}

	// Four features in a consistent [1 4] tensor: MLServer does not check shapes against the
	// model's metadata; scikit-learn raises, and MLServer answers a bare 500.
	four := []Tensor{{Name: "vitals", Shape: []int64{1, 4}, Data: []float32{72, 14, 98, 125}}}
	_, err = c.Infer(ctx, four)
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusInternalServerError || se.Message == "" {
		t.Fatalf("[1 4] without metadata: %v, want MLServer's 500 with its message", err)
	}
	t.Logf("[1 4] sent to MLServer: %v (Retryable %v: a 5xx)", err, Retryable(err))

	// Once the client has the metadata, it refuses the same tensor itself.
	if _, err := c.Metadata(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = c.Infer(ctx, four)
	if !errors.Is(err, ErrInvalidInput) || Retryable(err) || !strings.Contains(err.Error(), "shape [1 4], the model wants [-1 5]") {
		t.Errorf("[1 4] with metadata: %v, want a non-retryable ErrInvalidInput naming both shapes", err)
	}
	_, err = c.Infer(ctx, []Tensor{{Name: "vital", Shape: []int64{1, 5}, Data: make([]float32, 5)}})
	if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), "the model's inputs are [vitals]") {
		t.Errorf("misnamed input with metadata: %v, want ErrInvalidInput naming the model's inputs", err)
	}
}

// TestMLServerKillRestart: after Kill (SIGKILL, as a crash), Infer and Ready fail fast with
// retryable transport errors; after Restart, the same client (same URL) is ready again and
// gives the same answer.
func TestMLServerKillRestart(t *testing.T) {
	s := mlservertest.Start(t)
	ctx := context.Background()
	c := newClient(t, Config{BaseURL: s.URL, Model: demoModel, Version: "1", Timeout: time.Second})
	in := []Tensor{{Name: "vitals", Shape: []int64{1, 5}, Data: []float32{104, 19, 96, 118, 37.4}}}
	before, err := c.Infer(ctx, in) // leaves a keep-alive connection in the pool
	if err != nil {
		t.Fatal(err)
	}
	url := s.URL

	s.Kill()
	s.Kill() // a second Kill of a dead server does nothing

	for i := range 2 { // first on the pooled connection's remains, then on a new dial
		start := time.Now()
		_, err := c.Infer(ctx, in)
		took := time.Since(start)
		if err == nil {
			t.Fatalf("Infer %d after kill: no error", i)
		}
		var te *TransportError
		if !errors.As(err, &te) || !Retryable(err) {
			t.Errorf("Infer %d after kill: %v, want a retryable TransportError", i, err)
		}
		if took >= 2*time.Second {
			t.Errorf("Infer %d after kill took %v, want < 2 s", i, took)
		}
		t.Logf("Infer %d after kill: %v in %v (connection refused: %v)", i, err, took.Round(time.Millisecond), errors.Is(err, syscall.ECONNREFUSED))
	}
	err = c.Ready(ctx)
	if err == nil || !Retryable(err) || errors.Is(err, ErrNotReady) {
		t.Fatalf("Ready after kill: %v, want a retryable transport error", err)
	}
	t.Logf("Ready after kill: %v", err)

	s.Restart(t)
	if s.URL != url {
		t.Fatalf("URL after Restart = %s, want %s", s.URL, url)
	}
	if err := c.Ready(ctx); err != nil {
		t.Fatalf("Ready after Restart: %v\n%s", err, s.Log())
	}
	after, err := c.Infer(ctx, in)
	if err != nil {
		t.Fatalf("Infer after Restart: %v\n%s", err, s.Log())
	}
	if after[0].Data[1] != before[0].Data[1] {
		t.Errorf("P(deterioration) after Restart = %v, before %v", after[0].Data[1], before[0].Data[1])
	}
	if log := s.Log(); !strings.Contains(log, "mlservertest: start 1") || !strings.Contains(log, "mlservertest: start 2") {
		t.Errorf("Log does not hold both runs' output:\n%s", log)
	}
}

// benchInput is one row of the demo model's input, batch 1.
var benchInput = []Tensor{{Name: "vitals", Datatype: "FP32", Shape: []int64{1, 5}, Data: []float32{104, 19, 96, 118, 37.4}}}

// reportLatency adds req/s and latency percentiles to a benchmark's output.
func reportLatency(b *testing.B, lat []time.Duration, total time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(len(lat))/total.Seconds(), "req/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkInfer: Client.Infer, batch 1, one request at a time, against the real MLServer.
func BenchmarkInfer(b *testing.B) {
	s := sharedServer(b)
	c := newClient(b, Config{BaseURL: s.URL, Model: demoModel})
	ctx := context.Background()
	if _, err := c.Infer(ctx, benchInput); err != nil { // warm the connection
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		t0 := time.Now()
		out, err := c.Infer(ctx, benchInput)
		if err != nil {
			b.Fatal(err)
		}
		if len(out) != 1 || len(out[0].Data) != 2 {
			b.Fatalf("outputs %+v", out)
		}
		lat = append(lat, time.Since(t0))
	}
	total := time.Since(start)
	b.StopTimer()
	reportLatency(b, lat, total)
}

// BenchmarkInferDirect is the raw baseline: the same JSON, posted with a bare http.Client and
// the body read and dropped, so Client's own overhead (encoding, checks, decoding) shows as
// the difference from BenchmarkInfer.
func BenchmarkInferDirect(b *testing.B) {
	s := sharedServer(b)
	body := encodeRequest(nil, benchInput)
	url := s.URL + "/v2/models/" + demoModel + "/infer"
	hc := &http.Client{}
	post := func() error {
		resp, err := hc.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	if err := post(); err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		t0 := time.Now()
		if err := post(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	total := time.Since(start)
	b.StopTimer()
	reportLatency(b, lat, total)
}
