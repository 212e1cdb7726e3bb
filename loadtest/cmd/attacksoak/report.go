package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
)

// report is the soak's outcome: the legitimate traffic alone and under attack, and what each
// attack was answered.
type report struct {
	Baseline     phase    `json:"baseline"`
	Attacked     phase    `json:"attacked"`
	P99Ratio     float64  `json:"p99Ratio"`
	Attacks      []string `json:"attacks"`
	NodeAnswered bool     `json:"nodeAnsweredAfter"`
}

func (r report) print(w io.Writer) {
	line := func(name string, p phase) {
		fmt.Fprintf(w, "%-10s %7d requests, %d errors %v, latency %s\n", name, p.Requests, p.Errors, p.ByStatus, p.Latency)
		fmt.Fprintf(w, "           %s\n", p.CPU)
		for _, call := range slices.Sorted(maps.Keys(p.ByCall)) {
			fmt.Fprintf(w, "           %-22s %s\n", call, p.ByCall[call])
		}
		for call, sample := range p.Samples {
			fmt.Fprintf(w, "           first error of %s: %s\n", call, sample)
		}
	}
	line("baseline", r.Baseline)
	line("attacked", r.Attacked)
	fmt.Fprintf(w, "p99 under attack / baseline: %.2f; /readyz after: %v\nattacks (answers × count):\n", r.P99Ratio, r.NodeAnswered)
	for _, a := range r.Attacks {
		fmt.Fprintln(w, "  "+a)
	}
	b, _ := json.Marshal(r)
	fmt.Fprintf(w, "json: %s\n", b)
}
