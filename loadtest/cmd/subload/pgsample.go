package main

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// pgSampleEvery is how often -self samples the node's active Postgres backends.
const pgSampleEvery = 50 * time.Millisecond

// pgSampler samples pg_stat_activity of the -self node's database while a phase runs: which
// statements are running and what they wait on (wait_event_type/wait_event; CPU when none).
// Samples × pgSampleEvery estimate the backend time each statement took, where the notifier's
// and the deliverer's time goes on the Postgres side.
type pgSampler struct {
	pool *pgxpool.Pool
	mu   sync.Mutex
	n    int
	hits map[[2]string]int // (wait, statement) → samples
}

// pgActivity is one statement's share of a phase's samples.
type pgActivity struct {
	Wait      string  `json:"wait"`
	Statement string  `json:"statement"` // its first characters
	Samples   int     `json:"samples"`
	Backends  float64 `json:"backends"` // average backends running it
}

// run samples until ctx ends.
func (s *pgSampler) run(ctx context.Context) {
	t := time.NewTicker(pgSampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rows, err := s.pool.Query(ctx, `select coalesce(wait_event_type || ':' || wait_event, 'CPU'),
	left(regexp_replace(query, '\s+', ' ', 'g'), 90)
from pg_stat_activity
where state = 'active' and pid <> pg_backend_pid() and datname = current_database()`)
		if err != nil {
			continue
		}
		var got [][2]string
		for rows.Next() {
			var k [2]string
			if rows.Scan(&k[0], &k[1]) == nil {
				got = append(got, k)
			}
		}
		rows.Close()
		s.mu.Lock()
		s.n++
		for _, k := range got {
			s.hits[k]++
		}
		s.mu.Unlock()
	}
}

// sample runs the sampler for the duration of fn and returns the top statements.
func (s *pgSampler) sample(ctx context.Context, fn func()) []pgActivity {
	if s == nil {
		fn()
		return nil
	}
	s.mu.Lock()
	s.n, s.hits = 0, map[[2]string]int{}
	s.mu.Unlock()
	sctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.run(sctx) }()
	fn()
	stop()
	<-done
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []pgActivity
	for k, v := range s.hits {
		out = append(out, pgActivity{Wait: k[0], Statement: k[1], Samples: v, Backends: float64(v) / float64(max(s.n, 1))})
	}
	slices.SortFunc(out, func(a, b pgActivity) int { return cmp.Compare(b.Samples, a.Samples) })
	return out[:min(len(out), 12)]
}
