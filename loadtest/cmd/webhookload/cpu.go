package main

import (
	"context"
	"time"

	"carehub/loadtest"
	"carehub/loadtest/loadcli"
	"carehub/loadtest/wsfleet"
)

// The CPU a run costs, an event delivered, told apart by process. On this machine the ratio to
// the raw baseline follows these costs more than anything else: the node, Postgres and the
// receiver share its cores, and runs at 16, 32 and 64 in flight delivered at the same rate
// (docs/PERFORMANCE.md, issue 55, eleventh session). The node's own comes from its /metrics
// (process_cpu_seconds_total), webhookload's from its rusage, the rest (Postgres, and anything
// else running) from the machine's busy time less those two: a figure only when the node and
// its Postgres are this machine's, as the loopback-only tool assumes.

// cpuSample is where the CPU stood at one moment of the run.
type cpuSample struct {
	node, self, busy, idle time.Duration
	at                     time.Time
}

// sampleCPU reads the node's, this process's and the machine's CPU so far; ok is false when one
// of them cannot be read (a node without the process metric, a machine without /proc).
func sampleCPU(ctx context.Context, node *wsfleet.Node, metricsURL string) (cpuSample, bool) {
	m, err := node.Metrics(ctx, metricsURL, "process_cpu_seconds_total")
	secs, found := m["process_cpu_seconds_total"]
	if err != nil || !found {
		return cpuSample{}, false
	}
	busy, idle, err := loadtest.MachineCPU()
	if err != nil {
		return cpuSample{}, false
	}
	return cpuSample{node: time.Duration(secs * float64(time.Second)), self: loadcli.ProcessCPU(), busy: busy, idle: idle, at: time.Now()}, true
}

// cpuReport is the CPU of carehub's run (from the first publish to the last delivery), in µs
// an event delivered, and the cores left idle meanwhile.
type cpuReport struct {
	NodeUs      float64 `json:"nodeUs"`        // the node's process: publish, Kafka, consumers, attempts
	Webhookload float64 `json:"webhookloadUs"` // this process: the publishing clients and the receiver
	RestUs      float64 `json:"restUs"`        // the rest of the machine: Postgres, and whatever else ran
	IdleCores   float64 `json:"idleCores"`
}

// cpuBetween is the CPU from a to b, for events delivered.
func cpuBetween(a, b cpuSample, events int64) *cpuReport {
	if events <= 0 || !b.at.After(a.at) {
		return nil
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(events) }
	node, self := b.node-a.node, b.self-a.self
	return &cpuReport{NodeUs: per(node), Webhookload: per(self), RestUs: per(max(b.busy-a.busy-node-self, 0)),
		IdleCores: (b.idle - a.idle).Seconds() / b.at.Sub(a.at).Seconds()}
}
