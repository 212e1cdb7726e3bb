// Package onnx runs ONNX models in-process on an embedded ONNX Runtime (the C library
// libonnxruntime.so, loaded at run time through github.com/yalue/onnxruntime_go).
//
// # The runtime library
//
// The library is not linked at build time: Init dlopens it once per process. Its path is the
// argument to Init, else the environment variable CAREHUB_ONNXRUNTIME_LIB, else the default
// cache path that `make onnxruntime-deps` (deploy/local/onnxruntime/fetch.sh) installs to,
// $HOME/.cache/carehub/onnxruntime/<RuntimeVersion>/libonnxruntime.so. The library's version
// must provide the C API the binding was built against (ORT_API_VERSION 24, onnxruntime
// 1.24.x; newer releases also serve that API); fetch.sh installs exactly RuntimeVersion.
//
// The binding uses cgo. In a CGO_ENABLED=0 build the package still compiles, but Init and Load
// return ErrNoCgo.
//
// # Models
//
// Load takes the bytes of an .onnx file, checks that the runtime can load them (ErrInvalidModel
// otherwise), reads the input/output signature (names, element types, shapes with -1 for
// dynamic dimensions) and opens `replicas` sessions. Run takes one free session, waiting in a
// queue (QueueDepth) while all are busy, and gives up with the context's error when ctx ends
// first; a run already inside the runtime is asked to stop when ctx ends. Each session runs
// one request at a time on one intra-op thread, so replicas is the model's CPU parallelism.
//
// Only float32 tensors are supported for now: Load refuses a model with an input or output of
// another element type, or one that is not a plain tensor (ONNX-ML maps and sequences, as
// scikit-learn converters emit with zipmap on). Run checks every input against the signature
// (missing or unknown names, rank, fixed dimensions, data length) before the runtime sees it.
//
// models/demo holds a small synthetic demo model (deterioration.onnx) and the script that
// trains it.
package onnx
