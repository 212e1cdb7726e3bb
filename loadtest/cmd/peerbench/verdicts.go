package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"carehub/loadtest/report"
)

// verdict is one of issue 59's goals on one scenario of the run: carehub's figure beside the
// peer's, their ratio, the goal and whether it held. The run's verdicts together are its one
// report (peers-summary), beside each workload's own report with every figure.
type verdict struct {
	Workload string  `json:"workload"`
	Scenario string  `json:"scenario"`
	Peer     string  `json:"peer"`
	Figure   string  `json:"figure"`
	Carehub  float64 `json:"carehub"`
	PeerFig  float64 `json:"peerFigure"`
	Ratio    float64 `json:"ratio"` // carehub ÷ peer
	Goal     string  `json:"goal"`
	Met      bool    `json:"met"`
	Report   string  `json:"report"` // the workload's report, with the rest of its figures
}

// verdicts collects the run's verdicts, workload by workload.
type verdicts struct{ list []verdict }

func (v *verdicts) add(list ...verdict) {
	if v != nil {
		v.list = append(v.list, list...)
	}
}

// atLeast and noWorse build the two kinds of goal: carehub's figure at least a number of times the
// peer's (throughput), or no higher than the peer's (latency, memory).
func atLeast(least float64) (string, func(float64) bool) {
	return fmt.Sprintf("≥ %g×", least), func(r float64) bool { return r >= least }
}

func noWorse() (string, func(float64) bool) {
	return "≤ 1× (no worse)", func(r float64) bool { return r > 0 && r <= 1 }
}

func judged(workload, scenario, peer, figure string, carehub, peerFig, ratio float64, goal string, met func(float64) bool, path string) verdict {
	return verdict{Workload: workload, Scenario: scenario, Peer: peer, Figure: figure, Carehub: carehub, PeerFig: peerFig,
		Ratio: ratio, Goal: goal, Met: met(ratio), Report: path}
}

// fhirVerdicts: import at least 10× HAPI's readable Observations/s on vitals and 5× its
// resources/s on Synthea, p99 lower; search p99 lower.
func fhirVerdicts(sum summary, path string) []verdict {
	var out []verdict
	for _, k := range slices.Sorted(maps.Keys(sum.Comparisons)) {
		c := sum.Comparisons[k]
		workload, _, _ := strings.Cut(k, " ")
		switch workload {
		case "vitals", "synthea":
			least := 10.0
			if workload == "synthea" {
				least = 5
			}
			g, met := atLeast(least)
			out = append(out, judged(workload, k, "HAPI FHIR JPA", "readable "+c.Unit, c.CarehubReadable, c.HAPIReadable, c.RatioReadable, g, met, path))
		}
		g, met := noWorse()
		out = append(out, judged(workload, k, "HAPI FHIR JPA", "p99 ms", c.CarehubP99Ms, c.HAPIP99Ms, c.RatioP99, g, met, path))
	}
	return out
}

// fanoutVerdicts: p99 and memory per socket no worse than the peer's.
func fanoutVerdicts(sum fanoutSummary, path string) []verdict {
	var out []verdict
	for _, k := range slices.Sorted(maps.Keys(sum.Comparisons)) {
		c := sum.Comparisons[k]
		g, met := noWorse()
		out = append(out,
			judged("fanout", k, "graphql-ws", "publish → received p99 ms", c.CarehubP99Ms, c.PeerP99Ms, c.RatioP99, g, met, path),
			judged("fanout", k, "graphql-ws", "RSS KiB per socket, subscribed", c.CarehubKiBPerSocket, c.PeerKiBPerSocket, c.RatioMemory, g, met, path))
	}
	return out
}

// analyticsVerdicts: rows/s at least 0.8× the engine's; in a steady run, lag p99 below its
// flush interval.
func analyticsVerdicts(sum analyticsSummary, path string) []verdict {
	var out []verdict
	for _, k := range slices.Sorted(maps.Keys(sum.Comparisons)) {
		c := sum.Comparisons[k]
		g, met := atLeast(minRowsRatio)
		out = append(out, judged("analytics", k, "ClickHouse Kafka engine", "rows/s", c.CarehubRowsPerSec, c.EngineRowsPerSec, c.RatioRows, g, met, path))
		if c.GoalLag != nil {
			flush := float64(c.EngineFlushMs)
			out = append(out, verdict{Workload: "analytics", Scenario: k, Peer: "ClickHouse Kafka engine",
				Figure: "lag p99 ms (peer: its flush interval)", Carehub: c.CarehubLagP99Ms, PeerFig: flush,
				Ratio: ratio(c.CarehubLagP99Ms, flush), Goal: "< 1× (below the flush)", Met: *c.GoalLag, Report: path})
		}
	}
	return out
}

// verdictSummary is the summary of the run's one report.
type verdictSummary struct {
	Workloads []string  `json:"workloads"`
	Met       int       `json:"met"`
	Goals     int       `json:"goals"`
	Verdicts  []verdict `json:"verdicts"`
	Failures  []string  `json:"failures,omitempty"` // workloads that did not finish
}

// writeVerdicts writes the run's one report: every goal of every workload run, met or not.
func writeVerdicts(results string, started time.Time, workloads []string, v *verdicts, failures []error) error {
	sum := verdictSummary{Workloads: workloads, Verdicts: v.list, Goals: len(v.list)}
	for _, x := range v.list {
		if x.Met {
			sum.Met++
		}
	}
	for _, f := range failures {
		sum.Failures = append(sum.Failures, f.Error())
	}
	printVerdicts(os.Stdout, sum)
	path, err := report.Write(results, report.Report{Scenario: "peers-summary", Started: started, Unit: "goals",
		Summary: sum, Series: []report.Point{}})
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "peerbench: the run's report %s (charts: %s)\n", path, report.ChartsCommand(path))
	return nil
}

func printVerdicts(w io.Writer, s verdictSummary) {
	fmt.Fprintf(w, "\nissue 59's goals: %d of %d met\n", s.Met, s.Goals)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tpeer\tfigure\tcarehub\tpeer\tratio\tgoal\tmet\t")
	for _, v := range s.Verdicts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%.1f\t%.2f×\t%s\t%v\t\n", v.Scenario, v.Peer, v.Figure, v.Carehub, v.PeerFig, v.Ratio, v.Goal, v.Met)
	}
	_ = tw.Flush()
	for _, f := range s.Failures {
		fmt.Fprintf(w, "not finished: %s\n", f)
	}
}
