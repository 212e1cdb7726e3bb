package workflows

import (
	"testing"
	"time"

	"carehub/storage/demo"
)

// BenchmarkRunnerThroughput measures runs per second end to end through the runner: Start (run,
// command and event in one transaction), the outbox relay, the broker, the runner's claim, four
// steps each committed with its result (load_patient, score_news2, assess_risk, create_alert:
// one report and diagnostic.result_ready per run) and the end state with its events. Run it with
// a fixed count, e.g. -benchtime=400x.
func BenchmarkRunnerThroughput(b *testing.B) {
	h := newHarness(b)
	h.relay()
	h.startRunner(RunnerConfig{Lease: 30 * time.Second})
	w := h.workflow("Bench", []string{"load_patient", "score_news2", "assess_risk", "create_alert"})
	warm := h.start(w, demo.DeterioratingPatientID) // the group has joined once this one ends
	h.wait(warm.ID, 60*time.Second, "the warm-up run", ended)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		h.start(w, demo.DeterioratingPatientID)
	}
	deadline := time.Now().Add(10 * time.Minute)
	for h.count(`select count(*) from workflow_runs where workflow_id = $1 and status = 'COMPLETED'`, w.ID) < b.N+1 {
		if time.Now().After(deadline) {
			b.Fatal("runs did not complete")
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "runs/s")
}
