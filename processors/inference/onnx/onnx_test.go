//go:build cgo

package onnx

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"carehub/models"
)

// The tests run the real runtime. They need libonnxruntime.so at $CAREHUB_ONNXRUNTIME_LIB or
// at the default cache path; without it they fail (Init's error names `make onnxruntime-deps`).

func initRuntime(tb testing.TB) {
	tb.Helper()
	if err := Init(""); err != nil {
		tb.Fatalf("ONNX Runtime unavailable: %v", err)
	}
}

func demoModel(testing.TB) []byte { return models.Deterioration }

// expectedCase is a row of models/demo/expected.json in the runtime's element type.
type expectedCase struct {
	Name   string
	Input  []float32
	Output float32
}

type expectedFile struct {
	Input, Output string
	Tolerance     float64
	Cases         []expectedCase
}

func expected(tb testing.TB) expectedFile {
	tb.Helper()
	cases, tolerance := models.DeteriorationCases()
	e := expectedFile{Input: "vitals", Output: "probability", Tolerance: tolerance}
	for _, c := range cases {
		in := make([]float32, len(c.Input))
		for i, x := range c.Input {
			in[i] = float32(x)
		}
		e.Cases = append(e.Cases, expectedCase{c.Name, in, float32(c.Output)})
	}
	if len(e.Cases) == 0 || e.Tolerance <= 0 || e.Tolerance > 1e-5 {
		tb.Fatalf("expected.json: %d cases, tolerance %g", len(e.Cases), e.Tolerance)
	}
	return e
}

func loadDemo(tb testing.TB, replicas int) *Model {
	tb.Helper()
	initRuntime(tb)
	m, err := Load(demoModel(tb), replicas)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := m.Close(); err != nil {
			tb.Error(err)
		}
	})
	return m
}

func TestInitLibraryMissing(t *testing.T) {
	err := checkLibrary("/nonexistent/libonnxruntime.so")
	if err == nil || !strings.Contains(err.Error(), "make onnxruntime-deps") || !strings.Contains(err.Error(), "/nonexistent/libonnxruntime.so") {
		t.Fatalf("error should name the path and `make onnxruntime-deps`: %v", err)
	}
	initRuntime(t)
	if err := Init(""); err != nil {
		t.Fatalf("second Init: %v", err)
	}
	if err := Init("/elsewhere/libonnxruntime.so"); err == nil || !strings.Contains(err.Error(), "already initialized") {
		t.Fatalf("Init with another library after a success: %v", err)
	}
	if v := LoadedRuntimeVersion(); !strings.HasPrefix(v, "1.") {
		t.Fatalf("runtime version %q", v)
	}
	t.Logf("onnxruntime %s from %s", LoadedRuntimeVersion(), LibraryPath())
}

func TestSignature(t *testing.T) {
	m := loadDemo(t, 1)
	got := m.Signature()
	if s := got.String(); s != "(vitals float[?,5]) -> (probability float[?,1])" {
		t.Fatalf("signature %s", s)
	}
	if got.Inputs[0].Shape[0] != -1 || got.Inputs[0].Shape[1] != 5 || got.Inputs[0].ElemType != "float" {
		t.Fatalf("input %+v", got.Inputs[0])
	}
	if f := got.Metadata["carehub.features"]; f != `["heart_rate", "respiratory_rate", "spo2", "systolic_bp", "temperature"]` {
		t.Fatalf("carehub.features metadata %q", f)
	}
	got.Inputs[0].Shape[1] = 99 // a copy: the model's own signature is untouched
	if m.Signature().Inputs[0].Shape[1] != 5 {
		t.Fatal("Signature() returned shared memory")
	}
	if m.Replicas() != 1 || m.QueueDepth() != 0 || m.InFlight() != 0 {
		t.Fatalf("replicas %d queue %d in flight %d", m.Replicas(), m.QueueDepth(), m.InFlight())
	}
}

func TestExpectedOutputs(t *testing.T) {
	m := loadDemo(t, 1)
	e := expected(t)
	ctx := context.Background()

	// one row per run (batch 1)
	for _, c := range e.Cases {
		out, err := m.Run(ctx, map[string]Tensor{e.Input: NewTensor(c.Input, 1, int64(len(c.Input)))})
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		p := out[e.Output]
		if len(out) != 1 || len(p.Shape) != 2 || p.Shape[0] != 1 || p.Shape[1] != 1 || len(p.Data) != 1 {
			t.Fatalf("%s: output %+v", c.Name, out)
		}
		if d := math.Abs(float64(p.Data[0] - c.Output)); d > e.Tolerance {
			t.Errorf("%s: got %v, onnxruntime (Python) gave %v, diff %g", c.Name, p.Data[0], c.Output, d)
		}
	}

	// every row in one batch
	var batch []float32
	for _, c := range e.Cases {
		batch = append(batch, c.Input...)
	}
	out, err := m.Run(ctx, map[string]Tensor{e.Input: NewTensor(batch, int64(len(e.Cases)), 5)})
	if err != nil {
		t.Fatal(err)
	}
	p := out[e.Output]
	if len(p.Data) != len(e.Cases) || p.Shape[0] != int64(len(e.Cases)) {
		t.Fatalf("batch output shape %v", p.Shape)
	}
	for i, c := range e.Cases {
		if d := math.Abs(float64(p.Data[i] - c.Output)); d > e.Tolerance {
			t.Errorf("batch row %d %s: got %v, want %v", i, c.Name, p.Data[i], c.Output)
		}
	}

	// an empty batch is a valid input
	out, err = m.Run(ctx, map[string]Tensor{e.Input: NewTensor(nil, 0, 5)})
	if err != nil || len(out[e.Output].Data) != 0 {
		t.Fatalf("empty batch: %v %+v", err, out)
	}
}

func TestLoadRejectsBadBytes(t *testing.T) {
	initRuntime(t)
	rng := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 4096)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	good := demoModel(t)
	for name, b := range map[string][]byte{
		"nil":       nil,
		"empty":     {},
		"random":    random,
		"text":      []byte("this is not an onnx model\n"),
		"truncated": good[:len(good)/2],
	} {
		m, err := Load(b, 1)
		if err == nil {
			m.Close()
			t.Errorf("%s: Load succeeded", name)
			continue
		}
		if !errors.Is(err, ErrInvalidModel) || !strings.Contains(err.Error(), "invalid model") {
			t.Errorf("%s: want ErrInvalidModel, got %v", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
}

func TestLoadRejectsNonFloat(t *testing.T) {
	initRuntime(t)
	_, err := Load(identityModel(7 /* INT64 */), 1)
	if !errors.Is(err, ErrInvalidModel) || !strings.Contains(err.Error(), "only float32") {
		t.Fatalf("int64 model: %v", err)
	}
	m, err := Load(identityModel(1 /* FLOAT */), 1)
	if err != nil {
		t.Fatalf("float identity model: %v", err)
	}
	defer m.Close()
	if s := m.Signature().String(); s != "(x float[3]) -> (y float[3])" {
		t.Fatalf("signature %s", s)
	}
}

func TestInputChecks(t *testing.T) {
	m := loadDemo(t, 1)
	row := []float32{72, 14, 98, 125, 36.8}
	for _, tc := range []struct {
		name   string
		inputs map[string]Tensor
		want   string
	}{
		{"missing", map[string]Tensor{}, `missing input "vitals"`},
		{"nil map", nil, `missing input "vitals"`},
		{"wrong name", map[string]Tensor{"vital": NewTensor(row, 1, 5)}, `missing input "vitals"`},
		{"extra", map[string]Tensor{"vitals": NewTensor(row, 1, 5), "zz": {}, "aa": {}}, `unknown input "aa", "zz"`},
		{"rank 1", map[string]Tensor{"vitals": NewTensor(row, 5)}, `rank 1`},
		{"rank 3", map[string]Tensor{"vitals": NewTensor(row, 1, 1, 5)}, `rank 3`},
		{"fixed dim", map[string]Tensor{"vitals": NewTensor(row[:4], 1, 4)}, `has 4 at axis 1`},
		{"short data", map[string]Tensor{"vitals": NewTensor(row, 2, 5)}, `has 5 values, its shape [2 5] needs 10`},
		{"long data", map[string]Tensor{"vitals": NewTensor(append(row, 1), 1, 5)}, `has 6 values`},
		{"negative dim", map[string]Tensor{"vitals": NewTensor(row, -1, 5)}, `negative dimension`},
		// 2^62 × 4 wraps round to 0 in int64: the data's length must not be matched by overflow.
		{"overflowing shape", map[string]Tensor{"vitals": NewTensor(nil, 1<<62, 5)}, `overflows`},
	} {
		_, err := m.Run(context.Background(), tc.inputs)
		if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: want ErrInvalidInput containing %q, got %v", tc.name, tc.want, err)
		}
	}

	// fixed and dynamic dims in one model with two inputs: a float[2,3] + b float[N,3]
	m2, err := Load(addModel(), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if s := m2.Signature().String(); s != "(a float[2,3], b float[?,3]) -> (c float[2,3])" {
		t.Fatalf("signature %s", s)
	}
	a := NewTensor([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	if _, err := m2.Run(context.Background(), map[string]Tensor{"a": NewTensor(make([]float32, 9), 3, 3), "b": a}); err == nil || !strings.Contains(err.Error(), `input "a" has 3 at axis 0`) {
		t.Fatalf("fixed dim 0: %v", err)
	}
	if _, err := m2.Run(context.Background(), map[string]Tensor{"a": a}); err == nil || !strings.Contains(err.Error(), `missing input "b"`) {
		t.Fatalf("missing b: %v", err)
	}
	out, err := m2.Run(context.Background(), map[string]Tensor{"a": a, "b": NewTensor([]float32{10, 20, 30}, 1, 3)})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(out["c"].Shape, out["c"].Data); got != "[2 3] [11 22 33 14 25 36]" {
		t.Fatalf("a+b = %s", got)
	}
	// b's N=2 is also valid (broadcast rules allow it as it matches a)
	if _, err := m2.Run(context.Background(), map[string]Tensor{"a": a, "b": a}); err != nil {
		t.Fatal(err)
	}
	// a dynamic dim the runtime cannot accept is the runtime's error, not a panic
	if _, err := m2.Run(context.Background(), map[string]Tensor{"a": a, "b": NewTensor(make([]float32, 9), 3, 3)}); err == nil || errors.Is(err, ErrInvalidInput) {
		t.Fatalf("broadcast 2x3 + 3x3 should fail in the runtime: %v", err)
	} else {
		t.Logf("runtime error: %v", err)
	}
}

func TestConcurrentRuns(t *testing.T) {
	m := loadDemo(t, 2)
	e := expected(t)
	const goroutines, runs = 16, 200
	var wg sync.WaitGroup
	var maxQueue sync.Mutex
	peak := 0
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for i := range runs {
				// batches of 1..4 rows drawn from the expected cases
				n := 1 + rng.IntN(4)
				idx := make([]int, n)
				var data []float32
				for j := range idx {
					idx[j] = rng.IntN(len(e.Cases))
					data = append(data, e.Cases[idx[j]].Input...)
				}
				out, err := m.Run(context.Background(), map[string]Tensor{e.Input: NewTensor(data, int64(n), 5)})
				if err != nil {
					errs <- fmt.Errorf("goroutine %d run %d: %w", g, i, err)
					return
				}
				p := out[e.Output].Data
				if len(p) != n {
					errs <- fmt.Errorf("goroutine %d run %d: %d outputs for %d rows", g, i, len(p), n)
					return
				}
				for j, k := range idx {
					if d := math.Abs(float64(p[j] - e.Cases[k].Output)); d > e.Tolerance {
						errs <- fmt.Errorf("goroutine %d run %d row %d (%s): got %v want %v", g, i, j, e.Cases[k].Name, p[j], e.Cases[k].Output)
						return
					}
				}
				if q := m.QueueDepth(); q > 0 {
					maxQueue.Lock()
					peak = max(peak, q)
					maxQueue.Unlock()
				}
				if f := m.InFlight(); f > 2 {
					errs <- fmt.Errorf("%d runs in flight with 2 replicas", f)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if m.QueueDepth() != 0 || m.InFlight() != 0 {
		t.Fatalf("after all runs: queue %d in flight %d", m.QueueDepth(), m.InFlight())
	}
	t.Logf("%d runs, peak queue depth seen %d", goroutines*runs, peak)
}

// holdAll takes every session, as long-running calls would, and returns a func giving them back.
func holdAll(m *Model) (release func()) {
	held := make([]*session, 0, m.replicas)
	for range m.replicas {
		held = append(held, <-m.free)
	}
	return func() {
		for _, s := range held {
			m.free <- s
		}
	}
}

func waitQueue(t *testing.T, m *Model, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for m.QueueDepth() != n {
		if time.Now().After(deadline) {
			t.Fatalf("queue depth %d, want %d", m.QueueDepth(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCancelWhileQueued(t *testing.T) {
	m := loadDemo(t, 1)
	in := map[string]Tensor{"vitals": NewTensor([]float32{72, 14, 98, 125, 36.8}, 1, 5)}
	release := holdAll(m)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := m.Run(ctx, in); done <- err }()
	waitQueue(t, m, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while queued: %v", err)
	}
	waitQueue(t, m, 0)

	tctx, tcancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer tcancel()
	if _, err := m.Run(tctx, in); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline while queued: %v", err)
	}
	if _, err := m.Run(ctx, in); !errors.Is(err, context.Canceled) {
		t.Fatalf("already-cancelled ctx: %v", err)
	}

	// a queued run proceeds once a session is free
	go func() { _, err := m.Run(context.Background(), in); done <- err }()
	waitQueue(t, m, 1)
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if m.QueueDepth() != 0 {
		t.Fatalf("queue depth %d", m.QueueDepth())
	}
}

func TestClose(t *testing.T) {
	initRuntime(t)
	m, err := Load(demoModel(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	in := map[string]Tensor{"vitals": NewTensor([]float32{72, 14, 98, 125, 36.8}, 1, 5)}
	release := holdAll(m)
	queued := make(chan error, 1)
	go func() { _, err := m.Run(context.Background(), in); queued <- err }()
	waitQueue(t, m, 1)
	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	if err := <-queued; !errors.Is(err, ErrClosed) {
		t.Fatalf("queued run during Close: %v", err)
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while sessions were busy", err)
	case <-time.After(20 * time.Millisecond):
	}
	release()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if _, err := m.Run(context.Background(), in); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Close: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// Tiny hand-encoded ONNX models (protobuf wire format), so the tests need no generator.

func pbVarint(v uint64) []byte {
	var b []byte
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func pbInt(field int, v int64) []byte {
	return append(pbVarint(uint64(field)<<3), pbVarint(uint64(v))...)
}

func pbBytes(field int, parts ...[]byte) []byte {
	var p []byte
	for _, x := range parts {
		p = append(p, x...)
	}
	b := append(pbVarint(uint64(field)<<3|2), pbVarint(uint64(len(p)))...)
	return append(b, p...)
}

func pbStr(field int, s string) []byte { return pbBytes(field, []byte(s)) }

// valueInfo: ValueInfoProto{name, type: TypeProto{tensor_type: {elem_type, shape}}}; dim < 0 is
// a symbolic dim "N".
func valueInfo(name string, elem int64, dims ...int64) []byte {
	var shape [][]byte
	for _, d := range dims {
		if d < 0 {
			shape = append(shape, pbBytes(1, pbStr(2, "N")))
		} else {
			shape = append(shape, pbBytes(1, pbInt(1, d)))
		}
	}
	return append(pbStr(1, name), pbBytes(2, pbBytes(1, pbInt(1, elem), pbBytes(2, shape...)))...)
}

func model(graph []byte) []byte {
	return append(append(pbInt(1, 8) /* ir_version */, pbBytes(8, pbStr(1, ""), pbInt(2, 17))... /* opset */), pbBytes(7, graph)...)
}

// identityModel: y = Identity(x), x and y of the given element type, shape [3].
func identityModel(elem int64) []byte {
	node := pbBytes(1, pbStr(1, "x"), pbStr(2, "y"), pbStr(4, "Identity"))
	return model(append(append(append(node, pbStr(2, "g")...), pbBytes(11, valueInfo("x", elem, 3))...), pbBytes(12, valueInfo("y", elem, 3))...))
}

// addModel: c = Add(a, b), a float[2,3], b float[N,3], c float[2,3].
func addModel() []byte {
	node := pbBytes(1, pbStr(1, "a"), pbStr(1, "b"), pbStr(2, "c"), pbStr(4, "Add"))
	g := append(node, pbStr(2, "g")...)
	g = append(g, pbBytes(11, valueInfo("a", 1, 2, 3))...)
	g = append(g, pbBytes(11, valueInfo("b", 1, -1, 3))...)
	g = append(g, pbBytes(12, valueInfo("c", 1, 2, 3))...)
	return model(g)
}
