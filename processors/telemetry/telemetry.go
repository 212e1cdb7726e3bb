// Package telemetry holds what carehub's components share about Prometheus registration.
package telemetry

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Shared registers c on reg and returns it, or returns the collector already registered under
// the same description, so several instances of a component in one process (two writers, two
// WebSocket handlers, a restarted node in tests) share their metrics instead of failing. Any other
// registration error is a programming error (a name clash between different collectors) and
// panics at start-up.
func Shared[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	panic(fmt.Sprintf("register metric: %v", err))
}
