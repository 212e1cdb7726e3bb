//go:build cgo

package onnx

import (
	"context"
	"errors"
	"fmt"
	"sync"

	ort "github.com/yalue/onnxruntime_go"
)

var (
	initMu   sync.Mutex
	initPath string // library loaded by the successful Init, "" before
)

// Init loads the ONNX Runtime library once per process. libPath "" means LibraryPath()
// ($CAREHUB_ONNXRUNTIME_LIB, else the default cache path). A missing library gives an error
// that names `make onnxruntime-deps`. Calling Init again with the same path (or "") after a
// success is a no-op; a different path is an error, as a process can hold one runtime only.
// A failed Init can be retried.
func Init(libPath string) error {
	initMu.Lock()
	defer initMu.Unlock()
	if initPath != "" {
		if libPath == "" || libPath == initPath {
			return nil
		}
		return fmt.Errorf("onnx: runtime already initialized from %s, cannot switch to %s", initPath, libPath)
	}
	if libPath == "" {
		libPath = LibraryPath()
	}
	if err := checkLibrary(libPath); err != nil {
		return err
	}
	ort.SetSharedLibraryPath(libPath)
	if err := ort.InitializeEnvironment(ort.WithLogLevelError()); err != nil {
		return fmt.Errorf("onnx: loading ONNX Runtime from %s (want onnxruntime %s; `make onnxruntime-deps` installs it): %w",
			libPath, RuntimeVersion, err)
	}
	initPath = libPath
	return nil
}

// LoadedRuntimeVersion returns the version string of the loaded library ("" before Init).
func LoadedRuntimeVersion() string {
	initMu.Lock()
	defer initMu.Unlock()
	if initPath == "" {
		return ""
	}
	return ort.GetVersion()
}

func initialized() bool {
	initMu.Lock()
	defer initMu.Unlock()
	return initPath != ""
}

// Load checks that model is a loadable ONNX model with float32 tensor inputs and outputs,
// reads its signature and opens replicas sessions (replicas < 1 means 1). See the package doc.
func Load(model []byte, replicas int) (*Model, error) {
	if !initialized() {
		return nil, ErrNotInitialized
	}
	if len(model) == 0 {
		return nil, fmt.Errorf("%w: empty model (0 bytes)", ErrInvalidModel)
	}
	if replicas < 1 {
		replicas = 1
	}
	ins, outs, err := ort.GetInputOutputInfoWithONNXData(model)
	if err != nil {
		return nil, fmt.Errorf("%w: ONNX Runtime cannot load the %d bytes as an ONNX model: %v", ErrInvalidModel, len(model), err)
	}
	sig := Signature{Inputs: make([]TensorInfo, len(ins)), Outputs: make([]TensorInfo, len(outs))}
	for i := range ins {
		if sig.Inputs[i], err = tensorInfo("input", &ins[i]); err != nil {
			return nil, err
		}
	}
	for i := range outs {
		if sig.Outputs[i], err = tensorInfo("output", &outs[i]); err != nil {
			return nil, err
		}
	}
	if len(sig.Inputs) == 0 || len(sig.Outputs) == 0 {
		return nil, fmt.Errorf("%w: model has %d inputs and %d outputs, needs at least one of each", ErrInvalidModel, len(sig.Inputs), len(sig.Outputs))
	}

	inNames := make([]string, len(sig.Inputs))
	for i, t := range sig.Inputs {
		inNames[i] = t.Name
	}
	outNames := make([]string, len(sig.Outputs))
	for i, t := range sig.Outputs {
		outNames[i] = t.Name
	}
	sessions := make([]*session, 0, replicas)
	fail := func(err error) (*Model, error) {
		for _, s := range sessions {
			_ = s.destroy()
		}
		return nil, err
	}
	for range replicas {
		s, err := newSession(model, inNames, outNames, sig.Outputs)
		if err != nil {
			return fail(err)
		}
		sessions = append(sessions, s)
	}
	if sig.Metadata, err = sessions[0].metadata(); err != nil {
		return fail(err)
	}
	return newModel(sig, sessions), nil
}

// metadata returns the model's custom metadata (ONNX metadata_props), nil when it has none.
func (s *session) metadata() (map[string]string, error) {
	md, err := s.s.GetModelMetadata()
	if err != nil {
		return nil, fmt.Errorf("%w: reading its metadata: %v", ErrInvalidModel, err)
	}
	defer md.Destroy()
	keys, err := md.GetCustomMetadataMapKeys()
	if err != nil || len(keys) == 0 {
		return nil, err
	}
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		if v, ok, err := md.LookupCustomMetadataMap(k); err == nil && ok {
			out[k] = v
		}
	}
	return out, nil
}

func tensorInfo(kind string, io *ort.InputOutputInfo) (TensorInfo, error) {
	if io.OrtValueType != ort.ONNXTypeTensor {
		return TensorInfo{}, fmt.Errorf("%w: %s %q is a %s, only plain tensors are supported (for scikit-learn models convert with zipmap=False)",
			ErrInvalidModel, kind, io.Name, io.OrtValueType)
	}
	if io.DataType != ort.TensorElementDataTypeFloat {
		return TensorInfo{}, fmt.Errorf("%w: %s %q has element type %s, only float32 is supported for now",
			ErrInvalidModel, kind, io.Name, io.DataType)
	}
	shape := make([]int64, len(io.Dimensions))
	for i, d := range io.Dimensions {
		if d < 0 {
			d = -1
		}
		shape[i] = d
	}
	return TensorInfo{Name: io.Name, ElemType: "float", Shape: shape}, nil
}

// session is one runtime session plus the run options used to stop its run when ctx ends.
// A session runs one request at a time (the Model's free list guarantees it).
type session struct {
	s       *ort.DynamicAdvancedSession
	opts    *ort.RunOptions
	inNames []string
	outputs []TensorInfo
	in      []ort.Value // scratch, len(inputs)
	out     []ort.Value // scratch, len(outputs)
}

func newSession(model []byte, inNames, outNames []string, outputs []TensorInfo) (*session, error) {
	so, err := ort.NewSessionOptions()
	if err != nil {
		return nil, fmt.Errorf("onnx: session options: %w", err)
	}
	defer so.Destroy()
	// Parallelism comes from replicas: one thread per session, no spinning pool threads.
	if err := so.SetIntraOpNumThreads(1); err != nil {
		return nil, fmt.Errorf("onnx: session options: %w", err)
	}
	if err := so.SetInterOpNumThreads(1); err != nil {
		return nil, fmt.Errorf("onnx: session options: %w", err)
	}
	// Run failures are returned to the caller; the runtime need not also log them.
	if err := so.SetLogSeverityLevel(ort.LoggingLevelFatal); err != nil {
		return nil, fmt.Errorf("onnx: session options: %w", err)
	}
	s, err := ort.NewDynamicAdvancedSessionWithONNXData(model, inNames, outNames, so)
	if err != nil {
		return nil, fmt.Errorf("%w: creating a session: %v", ErrInvalidModel, err)
	}
	ro, err := ort.NewRunOptions()
	if err != nil {
		_ = s.Destroy()
		return nil, fmt.Errorf("onnx: run options: %w", err)
	}
	return &session{s: s, opts: ro, inNames: inNames, outputs: outputs, in: make([]ort.Value, len(inNames)), out: make([]ort.Value, len(outNames))}, nil
}

func (s *session) run(ctx context.Context, inputs []Tensor) (_ map[string]Tensor, err error) {
	defer func() {
		for i, v := range s.in {
			if v != nil {
				_ = v.Destroy()
				s.in[i] = nil
			}
		}
		for i, v := range s.out {
			if v != nil {
				_ = v.Destroy()
				s.out[i] = nil
			}
		}
	}()
	for i, t := range inputs {
		v, err := ort.NewTensor(ort.Shape(t.Shape), t.Data)
		if err != nil {
			return nil, fmt.Errorf("onnx: input %q: %w", s.inNames[i], err)
		}
		s.in[i] = v
	}

	// Ask the runtime to stop this run if ctx ends while it is inside Run.
	if ctx.Done() != nil {
		fired := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			defer close(fired)
			_ = s.opts.Terminate()
		})
		defer func() {
			if !stop() {
				<-fired
				_ = s.opts.UnsetTerminate()
			}
		}()
	}
	if err := s.s.RunWithOptions(s.in, s.out, s.opts); err != nil {
		return nil, fmt.Errorf("onnx: run: %w", err)
	}

	res := make(map[string]Tensor, len(s.out))
	for i, v := range s.out {
		t, ok := v.(*ort.Tensor[float32])
		if !ok {
			return nil, fmt.Errorf("onnx: output %q: runtime returned %T, want a float32 tensor", s.outputs[i].Name, v)
		}
		res[s.outputs[i].Name] = Tensor{Shape: append([]int64(nil), t.GetShape()...), Data: t.GetData()}
	}
	return res, nil
}

func (s *session) destroy() error {
	return errors.Join(s.opts.Destroy(), s.s.Destroy())
}
