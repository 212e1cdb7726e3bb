//go:build cgo

package onnx

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkRun measures Run on the demo model (models/demo/deterioration.onnx) with one
// session, at batch 1 and batch 64, and with 2 sessions under parallel callers. runs/s counts
// Run calls, rows/s the vitals rows scored.
func BenchmarkRun(b *testing.B) {
	e := expected(b)
	for _, bc := range []struct {
		batch, replicas int
		parallel        bool
	}{
		{1, 1, false},
		{64, 1, false},
		{1, 2, true},
		{64, 2, true},
	} {
		name := fmt.Sprintf("batch=%d/replicas=%d", bc.batch, bc.replicas)
		if bc.parallel {
			name += "/parallel"
		}
		b.Run(name, func(b *testing.B) {
			m := loadDemo(b, bc.replicas)
			data := make([]float32, 0, bc.batch*5)
			for i := range bc.batch {
				data = append(data, e.Cases[i%len(e.Cases)].Input...)
			}
			in := map[string]Tensor{e.Input: NewTensor(data, int64(bc.batch), 5)}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			if bc.parallel {
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if _, err := m.Run(ctx, in); err != nil {
							b.Error(err)
							return
						}
					}
				})
			} else {
				for b.Loop() {
					if _, err := m.Run(ctx, in); err != nil {
						b.Fatal(err)
					}
				}
			}
			s := b.Elapsed().Seconds()
			b.ReportMetric(float64(b.N)/s, "runs/s")
			b.ReportMetric(float64(b.N*bc.batch)/s, "rows/s")
		})
	}
}
