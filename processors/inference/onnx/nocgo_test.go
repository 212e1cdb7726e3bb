//go:build !cgo

package onnx

import (
	"errors"
	"testing"
)

func TestNoCgo(t *testing.T) {
	if err := Init(""); !errors.Is(err, ErrNoCgo) {
		t.Fatalf("Init: %v", err)
	}
	if _, err := Load([]byte{1}, 1); !errors.Is(err, ErrNoCgo) {
		t.Fatalf("Load: %v", err)
	}
}
