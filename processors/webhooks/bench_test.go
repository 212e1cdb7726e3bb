package webhooks

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/events"
	"carehub/kernel/whsig"
)

// arrivals records when each delivery first reached a fast receiver.
type arrivals struct {
	mu    sync.Mutex
	first map[string]time.Time // webhook-id + path → first arrival
	n     int
	all   chan struct{}
	want  int
}

func (a *arrivals) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	key := r.Header.Get(whsig.HeaderID) + r.URL.Path
	a.mu.Lock()
	if _, ok := a.first[key]; !ok {
		a.first[key] = now
		a.n++
		if a.n == a.want {
			close(a.all)
		}
	}
	a.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// BenchmarkDelivery measures deliveries per second from events produced to Kafka to a fast
// receiver on loopback (one op = one delivery), and the latency from producing an event to its
// first attempt reaching the receiver (p50, p99, under that load).
func BenchmarkDelivery(b *testing.B) {
	for _, subs := range []int{1, 8} {
		b.Run(fmt.Sprintf("subscriptions=%d", subs), func(b *testing.B) { benchDelivery(b, subs) })
	}
}

func benchDelivery(b *testing.B, subs int) {
	f := newFixture(b)
	nEvents := (b.N + subs - 1) / subs
	a := &arrivals{first: map[string]time.Time{}, all: make(chan struct{}), want: nEvents * subs}
	srv := httptest.NewServer(a)
	defer srv.Close()
	for i := range subs {
		f.create(fmt.Sprintf("%s/%d", srv.URL, i), "*")
	}
	f.start(func(c *DispatcherConfig) { c.Schedule = DefaultSchedule; c.PollInterval = DefaultPollInterval })

	evs := make([]events.Event, nEvents)
	for i := range evs {
		ev, err := events.New("device.observation_received", f.orgID, f.projectID, events.SourceIntegration, events.SeverityInfo,
			map[string]any{"observationId": fmt.Sprintf("obs_%d", i), "value": 98.6, "unit": "degF"})
		if err != nil {
			b.Fatal(err)
		}
		evs[i] = ev
	}
	produced := make(map[string]time.Time, nEvents)
	b.ResetTimer()
	start := time.Now()
	const batch = 500
	for i := 0; i < len(evs); i += batch {
		chunk := evs[i:min(i+batch, len(evs))]
		recs := make([]*kgo.Record, len(chunk))
		for j, ev := range chunk {
			recs[j] = eventRecord(b, ev)
		}
		now := time.Now()
		if err := f.prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			b.Fatal(err)
		}
		for _, ev := range chunk {
			produced[ev.ID] = now
		}
	}
	select {
	case <-a.all:
	case <-time.After(5 * time.Minute):
		b.Fatalf("only %d of %d deliveries arrived", a.n, a.want)
	}
	elapsed := time.Since(start)
	b.StopTimer()

	lat := make([]time.Duration, 0, a.want)
	a.mu.Lock()
	for key, at := range a.first {
		lat = append(lat, at.Sub(produced[key[:len(evs[0].ID)]]))
	}
	a.mu.Unlock()
	slices.Sort(lat)
	b.ReportMetric(float64(a.want)/elapsed.Seconds(), "deliveries/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkFirstAttemptLatency measures, one event at a time (no load), the time from producing
// an event to its first attempt reaching the receiver.
func BenchmarkFirstAttemptLatency(b *testing.B) {
	f := newFixture(b)
	got := make(chan time.Time, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- time.Now()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	f.create(srv.URL, "*")
	f.start(func(c *DispatcherConfig) { c.Schedule = DefaultSchedule; c.PollInterval = DefaultPollInterval })
	// Warm up: group joined, connections open.
	f.publish("agent.run_completed", nil)
	<-got
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		ev, _ := events.New("agent.run_completed", f.orgID, f.projectID, events.SourceAgent, events.SeverityInfo, nil)
		start := time.Now()
		if err := f.prod.ProduceSync(context.Background(), eventRecord(b, ev)).FirstErr(); err != nil {
			b.Fatal(err)
		}
		select {
		case at := <-got:
			lat = append(lat, at.Sub(start))
		case <-time.After(time.Minute):
			b.Fatal("no delivery")
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
