package pipelinetest_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"carehub/e2e/pipelinetest"
	"carehub/e2e/servertest"
	"carehub/kernel/tick"
)

// Light load for the latency measurement: 200 events at 20/s from one client.
const (
	latencyEvents = 200
	latencyRate   = 20 // per second
	// pollEvery is the pause between two reads of the log; it is the measurement's resolution
	// (a read also takes a few ms). About 35 reads/s stays under the key's 50/s rate limit.
	pollEvery = 25 * time.Millisecond
)

// sample is one published event's timeline, all on this process's clock.
type sample struct {
	seq       int
	sent      time.Time // publishEvent request about to be sent
	answered  time.Time // publishEvent answered with the id
	id        string
	createdAt time.Time
	seen      time.Time // first read of GET /v1/events that served it returned
}

// TestPublishToLogLatency is the latency acceptance: 200 events published through GraphQL
// publishEvent at 20/s while another client reads GET /v1/events every 25 ms; each event's
// latency runs from the moment its publish request is sent to the moment a read that serves it
// returns (so it includes the publish call, the outbox, the relay, the broker, the event log
// writer's append and the read). The distribution is logged, never asserted: a loaded
// machine makes any bound a coin toss (the figures belong to loadtest/cmd/eventload); what the
// test asserts is that every event reaches the log exactly once, as published.
func TestPublishToLogLatency(t *testing.T) {
	s := servertest.Start(t)
	pub, reader := client(s), client(s)
	project := sepsisProject(t, pub)
	typ := uniqueType(t, "latency")

	// Warm-up, not measured: the first event waits for the writer group to join and be
	// assigned its partitions, which is start-up, not light load.
	warm := publishOne(t, pub, project, typ, payload{Worker: -1})
	servertest.Eventually(t, 60*time.Second, "the warm-up event in the log", func() bool {
		return visible(t, reader, project, typ, []string{warm}) == 1
	})

	var (
		mu      sync.Mutex
		samples []*sample
		done    = make(chan struct{}) // publishing finished
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Reader: until every sample is seen (or the context ends), read the events created since
	// the oldest unseen publish and stamp the ones seen for the first time.
	readerDone := make(chan error, 1)
	var reads int
	go func() {
		readerDone <- func() error {
			for {
				mu.Lock()
				var oldest time.Time
				unseen := 0
				for _, s := range samples {
					if s.seen.IsZero() {
						unseen++
						if oldest.IsZero() || s.sent.Before(oldest) {
							oldest = s.sent
						}
					}
				}
				mu.Unlock()
				select {
				case <-done:
					if unseen == 0 {
						return nil
					}
				default:
				}
				if unseen == 0 {
					if !tick.Sleep(ctx, 5*time.Millisecond) {
						return ctx.Err()
					}
					continue
				}
				// createdAt is stamped by the server after the request was sent, on the same
				// host clock; the 100 ms margin is for nothing but safety.
				evs, _, _, err := reader.AllEvents(ctx, pipelinetest.Query{ProjectID: project, Type: typ,
					Since: oldest.Add(-100 * time.Millisecond), Limit: 1000}, 100)
				now := time.Now()
				if err != nil {
					return err
				}
				reads++
				mu.Lock()
				byID := map[string]*sample{}
				for _, s := range samples {
					if s.id != "" {
						byID[s.id] = s
					}
				}
				for _, ev := range evs {
					if s := byID[ev.ID]; s != nil && s.seen.IsZero() {
						s.seen = now
					}
				}
				mu.Unlock()
				if !tick.Sleep(ctx, pollEvery) {
					return ctx.Err()
				}
			}
		}()
	}()

	// Publisher: one call every 50 ms, never more than one in flight.
	tick := time.NewTicker(time.Second / latencyRate)
	began := time.Now()
	for i := range latencyEvents {
		<-tick.C
		sm := &sample{seq: i, sent: time.Now()}
		mu.Lock()
		samples = append(samples, sm)
		mu.Unlock()
		p, err := pub.Publish(ctx, project, typ, payload{Seq: i})
		if err != nil {
			tick.Stop()
			close(done)
			cancel()
			<-readerDone
			t.Fatalf("publish %d: %v", i, err)
		}
		mu.Lock()
		sm.answered, sm.id, sm.createdAt = time.Now(), p.ID, p.Timestamp
		mu.Unlock()
	}
	tick.Stop()
	elapsed := time.Since(began)
	close(done)
	if err := <-readerDone; err != nil {
		mu.Lock()
		unseen := 0
		for _, s := range samples {
			if s.seen.IsZero() {
				unseen++
			}
		}
		mu.Unlock()
		t.Fatalf("reading the log: %v (%d of %d events never seen)", err, unseen, len(samples))
	}

	var endToEnd, publishCall, afterAnswer []time.Duration
	for _, s := range samples {
		endToEnd = append(endToEnd, s.seen.Sub(s.sent))
		publishCall = append(publishCall, s.answered.Sub(s.sent))
		afterAnswer = append(afterAnswer, max(s.seen.Sub(s.answered), 0))
	}
	e2e := pipelinetest.Distribute(endToEnd)
	t.Logf("published %d events in %v (%.1f/s); %d reads of the log", len(samples), elapsed.Round(time.Millisecond),
		float64(len(samples))/elapsed.Seconds(), reads)
	t.Logf("publish sent → visible in GET /v1/events: %v", e2e)
	t.Logf("publishEvent call:                        %v", pipelinetest.Distribute(publishCall))
	t.Logf("publish answered → visible:               %v", pipelinetest.Distribute(afterAnswer))

	// The log holds each of them once, as published.
	lc := readLog(t, reader, project, typ, 1000)
	if len(lc.duplicates) > 0 || len(lc.byID) != latencyEvents+1 || lc.total != int64(latencyEvents+1) {
		t.Errorf("log: %d distinct events, %d duplicates, meta.total %d; want %d, 0, %d",
			len(lc.byID), len(lc.duplicates), lc.total, latencyEvents+1, latencyEvents+1)
	}
	for _, s := range samples {
		ev, ok := lc.byID[s.id]
		if !ok {
			t.Errorf("event %s (seq %d) not in the log", s.id, s.seq)
			continue
		}
		if p := decodePayload(t, ev); p.Seq != s.seq || !ev.CreatedAt.Equal(s.createdAt) {
			t.Errorf("event %s: payload seq %d createdAt %v, published seq %d createdAt %v", s.id, p.Seq, ev.CreatedAt, s.seq, s.createdAt)
		}
	}
}

func publishOne(t testing.TB, c *pipelinetest.Client, project, typ string, p payload) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pe, err := c.Publish(ctx, project, typ, p)
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	return pe.ID
}
