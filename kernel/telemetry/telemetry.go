// Package telemetry holds what carehub's components share about Prometheus registration.
package telemetry

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"

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

// Exclusive registers every collector of cs on reg, or none of them: for a component that must
// be alone on its registry. A collector already registered is the error refusal; any other
// registration error is returned as it is. A nil reg registers nothing.
func Exclusive(reg prometheus.Registerer, refusal string, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			Unregister(reg, cs[:i]...)
			if _, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
				return errors.New(refusal)
			}
			return err
		}
	}
	return nil
}

// Unregister unregisters cs from reg (nil: none), as a component that registered them with
// Exclusive does when it stops.
func Unregister(reg prometheus.Registerer, cs ...prometheus.Collector) {
	if reg == nil {
		return
	}
	for _, c := range cs {
		reg.Unregister(c)
	}
}

// BuildInfo is the gauge carehub_build_info{version,revision,goversion} 1: which build a node
// runs, to join on other series (`* on(instance) group_left(version) carehub_build_info`).
// revision is the VCS commit the binary was built from: the one given (a build's -ldflags, as
// the Makefile sets it), else the one Go stamps into a build in a checkout, else "unknown" (a
// build with -buildvcs=false, or from a tree without .git, such as a container's context).
func BuildInfo(version, revision string) prometheus.Collector {
	if revision == "" {
		revision = "unknown"
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" && s.Value != "" {
					revision = s.Value
				}
			}
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "carehub", Name: "build_info",
		Help:        "A metric with a constant 1 value labelled by the version, VCS revision and Go version carehub was built with.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": runtime.Version()}})
	g.Set(1)
	return g
}
