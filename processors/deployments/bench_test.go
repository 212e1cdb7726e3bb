package deployments_test

import (
	"fmt"
	"testing"
	"time"

	"carehub/processors/deployments"
	"carehub/storage/demo"
)

// BenchmarkInvoke measures invocations per second of one deployment on one node by replica count,
// with 16 concurrent callers scoring a patient's stored vitals (NEWS2: one indexed read of the
// latest observation per code, then the skill). It calls the Invoker directly: over HTTP the
// per-credential rate limit (50/s) would be the figure instead.
func BenchmarkInvoke(b *testing.B) {
	f := newFixture(b)
	ins := f.install(demo.NEWS2ModelName)
	c := f.controller(func() string { return base })
	for _, replicas := range []int{1, 2, 4} {
		d := f.deploy(ins, replicas, false)
		f.reconcile(c)
		inv := f.svc.Invoker(deployments.InvokerConfig{QueueWait: time.Minute, QueuePerReplica: 64})
		b.Run(fmt.Sprintf("replicas=%d", replicas), func(b *testing.B) {
			b.SetParallelism(8) // 8 × GOMAXPROCS callers
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := inv.Invoke(f.ctx, d.ID, deployments.InvokeRequest{PatientID: demo.DeterioratingPatientID}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
		})
	}
}
