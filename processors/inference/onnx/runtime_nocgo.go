//go:build !cgo

package onnx

import "context"

// Init always fails without cgo: the embedded runtime is reached through cgo.
func Init(libPath string) error { return ErrNoCgo }

// LoadedRuntimeVersion is "" without cgo.
func LoadedRuntimeVersion() string { return "" }

// Load always fails without cgo: the embedded runtime is reached through cgo.
func Load(model []byte, replicas int) (*Model, error) { return nil, ErrNoCgo }

type session struct{}

func (*session) run(context.Context, []Tensor) (map[string]Tensor, error) { return nil, ErrNoCgo }

func (*session) destroy() error { return nil }
