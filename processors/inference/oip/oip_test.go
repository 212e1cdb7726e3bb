package oip

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"carehub/models"
)

// These tests run a real MLServer (tests/mlserver) serving models/demo's deterioration model
// through MLServer's scikit-learn runtime. They need the venv that tests/mlserver/setup.sh
// makes at $MLSERVER_VENV (default $HOME/.cache/carehub/mlserver-venv); without it, or with
// one built from another requirements.txt, they fail and name the setup command.
//
// One server is shared by the tests and benchmarks of this process (started on first use,
// stopped by TestMain); TestMLServerKilled starts and kills its own.

const demoModel = "deterioration"

func TestMain(m *testing.M) {
	code := m.Run()
	stopShared()
	os.Exit(code)
}

// repoRoot is the directory holding go.mod, found upwards from this file.
func repoRoot(tb testing.TB) string {
	tb.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		tb.Fatal("runtime.Caller failed")
	}
	for dir := filepath.Dir(file); ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if filepath.Dir(dir) == dir {
			tb.Fatal("go.mod not found above " + file)
		}
	}
}

const setupHint = "run `tests/mlserver/setup.sh` (creates the MLServer venv; MLSERVER_VENV overrides its path)"

// mlserverVenv returns the venv's path, failing the test when it is missing or stale.
func mlserverVenv(tb testing.TB) string {
	tb.Helper()
	venv := os.Getenv("MLSERVER_VENV")
	if venv == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			tb.Fatalf("no home directory for the MLServer venv (%v); set MLSERVER_VENV or %s", err, setupHint)
		}
		venv = filepath.Join(home, ".cache", "carehub", "mlserver-venv")
	}
	if _, err := os.Stat(filepath.Join(venv, "bin", "mlserver")); err != nil {
		tb.Fatalf("MLServer venv missing (%v): %s", err, setupHint)
	}
	want, err := os.ReadFile(filepath.Join(repoRoot(tb), "tests", "mlserver", "requirements.txt"))
	if err != nil {
		tb.Fatal(err)
	}
	have, _ := os.ReadFile(filepath.Join(venv, "requirements.txt"))
	if !bytes.Equal(want, have) {
		tb.Fatalf("MLServer venv %s was built from another tests/mlserver/requirements.txt: %s", venv, setupHint)
	}
	return venv
}

var (
	modelOnce sync.Once
	modelDir  string // holds model.joblib, made once per process
	modelErr  error
)

// exportedModel runs tests/mlserver/export_sklearn.py once and returns the joblib's path.
func exportedModel(tb testing.TB, venv string) string {
	tb.Helper()
	root := repoRoot(tb)
	modelOnce.Do(func() {
		modelDir, modelErr = os.MkdirTemp("", "oip-model-")
		if modelErr != nil {
			return
		}
		cmd := exec.Command(filepath.Join(venv, "bin", "python"), filepath.Join(root, "tests", "mlserver", "export_sklearn.py"),
			"--onnx", filepath.Join(root, "models", "demo", "deterioration.onnx"),
			"--expected", filepath.Join(root, "models", "demo", "expected.json"),
			"--out", filepath.Join(modelDir, "model.joblib"))
		if out, err := cmd.CombinedOutput(); err != nil {
			modelErr = fmt.Errorf("export_sklearn.py: %v\n%s", err, out)
		}
	})
	if modelErr != nil {
		tb.Fatal(modelErr)
	}
	return filepath.Join(modelDir, "model.joblib")
}

// mlserver is one running `mlserver start` process.
type mlserver struct {
	URL  string
	dir  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func writeJSON(tb testing.TB, path string, v any) {
	tb.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		tb.Fatal(err)
	}
}

// startMLServer starts MLServer on free loopback ports (HTTP, gRPC and metrics) with a
// settings.json and the demo model's model-settings.json in a new temp dir, and waits until
// the model is ready. The caller stops it (stop).
func startMLServer(tb testing.TB) *mlserver {
	tb.Helper()
	venv := mlserverVenv(tb)
	joblib := exportedModel(tb, venv)
	dir, err := os.MkdirTemp("", "oip-mlserver-")
	if err != nil {
		tb.Fatal(err)
	}
	httpPort, grpcPort, metricsPort := freePort(tb), freePort(tb), freePort(tb)
	writeJSON(tb, filepath.Join(dir, "settings.json"), map[string]any{
		"debug":            false,
		"host":             "127.0.0.1",
		"http_port":        httpPort,
		"grpc_port":        grpcPort,
		"metrics_port":     metricsPort,
		"parallel_workers": 0, // infer in the server process: faster start, no worker pool
	})
	if err := os.Mkdir(filepath.Join(dir, demoModel), 0o755); err != nil {
		tb.Fatal(err)
	}
	writeJSON(tb, filepath.Join(dir, demoModel, "model-settings.json"), map[string]any{
		"name":           demoModel,
		"implementation": "mlserver_sklearn.SKLearnModel",
		"platform":       "sklearn",
		"versions":       []string{"1"},
		"inputs":         []map[string]any{{"name": "vitals", "datatype": "FP32", "shape": []int{-1, 5}}},
		"outputs":        []map[string]any{{"name": "predict_proba", "datatype": "FP64", "shape": []int{-1, 2}}},
		"parameters": map[string]any{
			"uri":     joblib,
			"version": "1",
			// mlserver-sklearn 1.7 returns predict() unless told otherwise.
			"extra": map[string]any{"predict_fn": "predict_proba"},
		},
	})
	logf, err := os.Create(filepath.Join(dir, "mlserver.log"))
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(venv, "bin", "mlserver"), "start", dir)
	cmd.Dir = dir // MLServer puts .envs and .metrics in its working directory
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "PYTHONUNBUFFERED=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		tb.Fatalf("starting mlserver: %v", err)
	}
	s := &mlserver{URL: fmt.Sprintf("http://127.0.0.1:%d", httpPort), dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); logf.Close(); close(s.done) }()

	c, err := New(Config{BaseURL: s.URL, Model: demoModel, Timeout: time.Second})
	if err != nil {
		s.stop()
		tb.Fatal(err)
	}
	start := time.Now()
	deadline := time.After(60 * time.Second)
	for c.Ready(context.Background()) != nil {
		select {
		case <-s.done:
			log := s.log()
			s.stop()
			tb.Fatalf("mlserver exited before it was ready:\n%s", log)
		case <-deadline:
			log := s.log()
			s.stop()
			tb.Fatalf("mlserver not ready after 60 s:\n%s", log)
		case <-time.After(100 * time.Millisecond):
		}
	}
	tb.Logf("mlserver ready at %s after %v", s.URL, time.Since(start).Round(10*time.Millisecond))
	return s
}

// log is the tail of the server's output.
func (s *mlserver) log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "mlserver.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// kill sends SIGKILL to the server's process group and waits for the exit.
func (s *mlserver) kill() {
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
}

// stop asks the server to shut down, kills it after 5 s, and removes its directory.
func (s *mlserver) stop() {
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		s.kill()
	}
	os.RemoveAll(s.dir)
}

var (
	sharedMu  sync.Mutex
	sharedSrv *mlserver
)

// sharedServer is the process's MLServer, started on first use.
func sharedServer(tb testing.TB) *mlserver {
	tb.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedSrv == nil {
		sharedSrv = startMLServer(tb)
	}
	return sharedSrv
}

func stopShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedSrv != nil {
		sharedSrv.stop()
		sharedSrv = nil
	}
	if modelDir != "" {
		os.RemoveAll(modelDir)
	}
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

func TestMLServerKilled(t *testing.T) {
	s := startMLServer(t)
	defer s.stop()
	ctx := context.Background()
	c := newClient(t, Config{BaseURL: s.URL, Model: demoModel, Timeout: time.Second})
	in := []Tensor{{Name: "vitals", Shape: []int64{1, 5}, Data: []float32{72, 14, 98, 125, 36.8}}}
	if _, err := c.Infer(ctx, in); err != nil { // leaves a keep-alive connection in the pool
		t.Fatal(err)
	}
	s.kill()
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
	if err := c.Ready(ctx); !Retryable(err) || errors.Is(err, ErrNotReady) {
		t.Errorf("Ready after kill: %v, want a retryable transport error", err)
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
