package onnx

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// RuntimeVersion is the onnxruntime release whose C API the binding
// (github.com/yalue/onnxruntime_go v1.27.0) is built against, and the one
// `make onnxruntime-deps` installs. Keep it equal to ONNXRUNTIME_VERSION in
// deploy/local/onnxruntime.
const RuntimeVersion = "1.24.1"

// LibEnv names the environment variable that gives the path of libonnxruntime.so.
const LibEnv = "CAREHUB_ONNXRUNTIME_LIB"

var (
	// ErrNoCgo: this binary was built with CGO_ENABLED=0, which the embedded runtime needs.
	ErrNoCgo = errors.New("onnx: the embedded ONNX runtime needs a cgo build (this binary was built with CGO_ENABLED=0)")
	// ErrNotInitialized: Load was called before a successful Init.
	ErrNotInitialized = errors.New("onnx: runtime not initialized: call onnx.Init first")
	// ErrInvalidModel wraps every reason a model's bytes are refused by Load.
	ErrInvalidModel = errors.New("onnx: invalid model")
	// ErrInvalidInput wraps every reason Run refuses its inputs before running.
	ErrInvalidInput = errors.New("onnx: invalid input")
	// ErrClosed: the model was closed.
	ErrClosed = errors.New("onnx: model closed")
)

// DefaultLibraryPath is where `make onnxruntime-deps` installs the library:
// $HOME/.cache/carehub/onnxruntime/<RuntimeVersion>/libonnxruntime.so.
func DefaultLibraryPath() string {
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		home = "~"
	}
	return filepath.Join(home, ".cache", "carehub", "onnxruntime", RuntimeVersion, "libonnxruntime.so")
}

// LibraryPath is the library Init("") loads: $CAREHUB_ONNXRUNTIME_LIB when set, else
// DefaultLibraryPath.
func LibraryPath() string {
	if p := os.Getenv(LibEnv); p != "" {
		return p
	}
	return DefaultLibraryPath()
}

// checkLibrary gives the error Init returns for a library file that is not there.
func checkLibrary(path string) error {
	st, err := os.Stat(path)
	if err == nil && !st.IsDir() {
		return nil
	}
	how := "the default path"
	if os.Getenv(LibEnv) != "" {
		how = "$" + LibEnv
	}
	return fmt.Errorf("onnx: ONNX Runtime library %s (from %s) not found: run `make onnxruntime-deps` to install it "+
		"(onnxruntime %s), or set %s to the path of libonnxruntime.so", path, how, RuntimeVersion, LibEnv)
}

// Tensor is a dense float32 tensor in row-major order. len(Data) must equal the product of
// Shape. Only float32 is supported for now.
type Tensor struct {
	Shape []int64
	Data  []float32
}

// NewTensor is a convenience constructor: Tensor{Shape: shape, Data: data}.
func NewTensor(data []float32, shape ...int64) Tensor { return Tensor{Shape: shape, Data: data} }

// TensorInfo describes one input or output of a model.
type TensorInfo struct {
	Name string
	// ElemType is the ONNX element type name ("float" for float32, the only one Load accepts).
	ElemType string
	// Shape has -1 for every dynamic (symbolic or unknown) dimension, e.g. [-1 5].
	Shape []int64
}

func (t TensorInfo) String() string {
	dims := make([]string, len(t.Shape))
	for i, d := range t.Shape {
		if d < 0 {
			dims[i] = "?"
		} else {
			dims[i] = fmt.Sprint(d)
		}
	}
	return fmt.Sprintf("%s %s[%s]", t.Name, t.ElemType, strings.Join(dims, ","))
}

// Signature is a model's inputs and outputs, in the model's order.
type Signature struct {
	Inputs  []TensorInfo
	Outputs []TensorInfo
	// Metadata is the model's custom metadata (ONNX metadata_props), such as carehub.features:
	// the JSON list of the vital signs, by name, that the columns of its input are.
	Metadata map[string]string
}

func (s Signature) String() string {
	in := make([]string, len(s.Inputs))
	for i, t := range s.Inputs {
		in[i] = t.String()
	}
	out := make([]string, len(s.Outputs))
	for i, t := range s.Outputs {
		out[i] = t.String()
	}
	return "(" + strings.Join(in, ", ") + ") -> (" + strings.Join(out, ", ") + ")"
}

func (s Signature) clone() Signature {
	c := Signature{Inputs: make([]TensorInfo, len(s.Inputs)), Outputs: make([]TensorInfo, len(s.Outputs)), Metadata: maps.Clone(s.Metadata)}
	for i, t := range s.Inputs {
		t.Shape = append([]int64(nil), t.Shape...)
		c.Inputs[i] = t
	}
	for i, t := range s.Outputs {
		t.Shape = append([]int64(nil), t.Shape...)
		c.Outputs[i] = t
	}
	return c
}

// checkInputs validates inputs against the signature and returns them in signature order.
func (s *Signature) checkInputs(inputs map[string]Tensor) ([]Tensor, error) {
	ordered := make([]Tensor, len(s.Inputs))
	for i, info := range s.Inputs {
		t, ok := inputs[info.Name]
		if !ok {
			return nil, fmt.Errorf("%w: missing input %q (model takes %s)", ErrInvalidInput, info.Name, s.inputList())
		}
		if len(t.Shape) != len(info.Shape) {
			return nil, fmt.Errorf("%w: input %q has rank %d (shape %v), model wants rank %d (%s)",
				ErrInvalidInput, info.Name, len(t.Shape), t.Shape, len(info.Shape), info)
		}
		n := int64(1)
		for d, dim := range t.Shape {
			if dim < 0 {
				return nil, fmt.Errorf("%w: input %q has negative dimension %d at axis %d", ErrInvalidInput, info.Name, dim, d)
			}
			if want := info.Shape[d]; want >= 0 && dim != want {
				return nil, fmt.Errorf("%w: input %q has %d at axis %d (shape %v), model fixes it to %d (%s)",
					ErrInvalidInput, info.Name, dim, d, t.Shape, want, info)
			}
			// The product must not overflow: a shape whose product wraps round to the data's
			// length would pass this check and have the runtime read past the data.
			if dim > 0 && n > math.MaxInt64/dim {
				return nil, fmt.Errorf("%w: input %q has shape %v, whose size overflows", ErrInvalidInput, info.Name, t.Shape)
			}
			n *= dim
		}
		if int64(len(t.Data)) != n {
			return nil, fmt.Errorf("%w: input %q has %d values, its shape %v needs %d",
				ErrInvalidInput, info.Name, len(t.Data), t.Shape, n)
		}
		ordered[i] = t
	}
	if len(inputs) != len(s.Inputs) {
		var extra []string
		for name := range inputs {
			if !s.hasInput(name) {
				extra = append(extra, fmt.Sprintf("%q", name))
			}
		}
		sort.Strings(extra)
		return nil, fmt.Errorf("%w: unknown input %s (model takes %s)", ErrInvalidInput, strings.Join(extra, ", "), s.inputList())
	}
	return ordered, nil
}

func (s *Signature) hasInput(name string) bool {
	for _, t := range s.Inputs {
		if t.Name == name {
			return true
		}
	}
	return false
}

func (s *Signature) inputList() string {
	names := make([]string, len(s.Inputs))
	for i, t := range s.Inputs {
		names[i] = t.String()
	}
	return strings.Join(names, ", ")
}

// Model is a loaded model with a fixed pool of sessions. It is safe for concurrent use.
type Model struct {
	sig      Signature
	replicas int
	free     chan *session // idle sessions; a Run holds one while it runs
	closed   chan struct{}
	closeMu  sync.Once
	waiting  atomic.Int64 // Runs queued for a session
	running  atomic.Int64 // Runs holding a session
	sessions []*session
}

// Signature returns the model's inputs and outputs (a copy).
func (m *Model) Signature() Signature { return m.sig.clone() }

// Replicas is the number of sessions, i.e. how many runs can execute at once.
func (m *Model) Replicas() int { return m.replicas }

// QueueDepth is the number of Runs currently waiting for a free session.
func (m *Model) QueueDepth() int { return int(m.waiting.Load()) }

// InFlight is the number of Runs currently holding a session.
func (m *Model) InFlight() int { return int(m.running.Load()) }

// Run checks inputs against the signature, waits for a free session (or for ctx to end, which
// returns ctx.Err()), runs the model and returns every output by name. Inputs are read, not
// kept, and must not be modified until Run returns; outputs are fresh slices owned by the
// caller.
func (m *Model) Run(ctx context.Context, inputs map[string]Tensor) (map[string]Tensor, error) {
	select {
	case <-m.closed:
		return nil, ErrClosed
	default:
	}
	ordered, err := m.sig.checkInputs(inputs)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var s *session
	select {
	case s = <-m.free: // fast path: no queueing
	default:
		m.waiting.Add(1)
		select {
		case s = <-m.free:
			m.waiting.Add(-1)
		case <-ctx.Done():
			m.waiting.Add(-1)
			return nil, ctx.Err()
		case <-m.closed:
			m.waiting.Add(-1)
			return nil, ErrClosed
		}
	}
	m.running.Add(1)
	defer func() {
		m.running.Add(-1)
		m.free <- s
	}()
	out, err := s.run(ctx, ordered)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("onnx: run stopped: %w", ctxErr)
		}
		return nil, err
	}
	return out, nil
}

// Close waits for runs in progress to finish, then frees every session. Queued and later Runs
// return ErrClosed. Close is idempotent.
func (m *Model) Close() error {
	var err error
	m.closeMu.Do(func() {
		close(m.closed)
		for range m.replicas {
			s := <-m.free
			if e := s.destroy(); e != nil && err == nil {
				err = e
			}
		}
		m.sessions = nil
	})
	return err
}

func newModel(sig Signature, sessions []*session) *Model {
	m := &Model{
		sig:      sig,
		replicas: len(sessions),
		free:     make(chan *session, len(sessions)),
		closed:   make(chan struct{}),
		sessions: sessions,
	}
	for _, s := range sessions {
		m.free <- s
	}
	return m
}
