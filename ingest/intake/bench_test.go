package intake_test

import (
	"bytes"
	"fmt"
	"testing"

	"carehub/ingest/intake"
	"carehub/kernel/access"
)

// BenchmarkSubmit measures intake end to end on the test broker and database: validation,
// patient lookup (cached after the first request), the Kafka transaction and its commit, for
// requests of 100 and 1000 observations. Report: observations acknowledged per second (one
// request at a time; the load test measures concurrency).
func BenchmarkSubmit(b *testing.B) {
	w := newWorld(b)
	in := newIntake(b, w)
	ctx := principal(w.orgA, access.Live)
	for _, n := range []int{100, 1000} {
		list := make([]map[string]any, n)
		for i := range list {
			list[i] = vital([]string{w.synthA, w.realA}[i%2], func(o map[string]any) {
				o["valueQuantity"] = map[string]any{"value": 50 + i%80, "unit": "/min"}
			})
		}
		for _, f := range []struct {
			name, contentType string
			body              []byte
		}{
			{"bundle", intake.MediaFHIRJSON, bundle(b, "batch", list...)},
			{"ndjson", intake.MediaFHIRNDJSON, ndjson(b, list...)},
		} {
			b.Run(fmt.Sprintf("%s-%d", f.name, n), func(b *testing.B) {
				b.SetBytes(int64(len(f.body)))
				for b.Loop() {
					res, err := in.Submit(ctx, intake.Submission{ContentType: f.contentType, Body: bytes.NewReader(f.body)})
					if err != nil || res.Answer.Accepted != n {
						b.Fatalf("%+v %v", res.Answer.Accepted, err)
					}
				}
				b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "obs/s")
			})
		}
	}
}
