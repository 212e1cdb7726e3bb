package webhooks

import (
	"context"
	"net/http"
	"syscall"
	"testing"
	"time"

	"carehub/internal/testenv"
	"carehub/kernel/events"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/postgres"
)

// A first attempt that failed is on disk, pending its retry, before the consumer commits its
// event's offset: nothing reads the event again after that. Postgres's WAL writer is made slow
// (a commit that did not wait for the WAL would stay in memory for seconds), Postgres is stopped
// at once (SIGQUIT: nothing more reaches disk) as soon as the consumer has committed, and the
// retry still comes once it is back.
func TestFirstAttemptOutlivesACrashOfPostgres(t *testing.T) {
	pg := slowWALCluster(t)
	f := newFixtureOn(t, pg.dsn)
	rc := newReceiver(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 0 {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	sub := f.create(rc.URL, "*")
	group := kafkatest.Group(t, "pgcrash")
	retryLater := []time.Duration{0, 5 * time.Second, time.Second, time.Second, time.Second, time.Second, time.Second, time.Second}
	first := f.start(func(c *DispatcherConfig) { c.Group, c.Schedule = group, retryLater })
	ev := f.publish("agent.run_completed", nil)

	testenv.Eventually(t, 30*time.Second, "the consumer to commit the event's offset", func() bool {
		return f.committedAll(group)
	})
	if got := rc.count(); got != 1 {
		t.Fatalf("%d attempts before the crash, want the first", got)
	}
	pg.crash(t, f, first)
	f.start(func(c *DispatcherConfig) { c.Group, c.Schedule = group, retryLater })
	f.waitDeliveryStatus(sub.ID, ev.ID, DeliverySucceeded)
	if got := requestIDs(rc.requests()); len(got) != 2 || got[0] != ev.ID || got[1] != ev.ID {
		t.Errorf("receiver got %v, want the event's first attempt and its retry", got)
	}
}

// A poll's deliveries recorded in several chunks are all on disk before its offsets are
// committed, though only the poll's last chunk waits for the WAL flush: the flush takes the
// chunks before it along. 600 events make a poll of 500 (two chunks) and one of 100; Postgres is
// stopped at once when the consumer has committed, and every delivery is found after it comes
// back, none sent twice.
func TestAPollsChunksOutliveACrashOfPostgres(t *testing.T) {
	pg := slowWALCluster(t)
	f := newFixtureOn(t, pg.dsn)
	rc := newReceiver(t, status(http.StatusNoContent))
	sub := f.create(rc.URL, "*")
	evs := make([]events.Event, 600)
	for i := range evs {
		ev, err := events.New("agent.run_completed", f.orgID, f.projectID, events.SourceIntegration, events.SeverityInfo, map[string]int{"i": i})
		if err != nil {
			t.Fatal(err)
		}
		evs[i] = ev
	}
	f.produce(evs...) // before the consumer starts, so that its first poll takes 500
	group := kafkatest.Group(t, "pgcrash-chunks")
	first := f.start(func(c *DispatcherConfig) { c.Group = group })
	testenv.Eventually(t, 30*time.Second, "the consumer to commit the events' offsets", func() bool {
		return f.committedAll(group)
	})
	pg.crash(t, f, first)
	recorded := map[string]bool{}
	for _, d := range f.deliveries(sub.ID) {
		if d.Status != DeliverySucceeded {
			t.Errorf("delivery of %s: %s, want succeeded", d.EventID, d.Status)
		}
		recorded[d.EventID] = true
	}
	for _, ev := range evs {
		if !recorded[ev.ID] {
			t.Errorf("delivery of %s lost with Postgres after its offset was committed", ev.ID)
		}
	}
	if got := rc.count(); got != len(evs) {
		t.Errorf("receiver got %d requests, want %d (each event once)", got, len(evs))
	}
}

// crashable is a durable cluster that a test stops at once and starts again.
type crashable struct {
	dir, dsn string
	local    *postgres.Local
}

// slowWALCluster starts a durable cluster in a directory of the test's, migrated, whose WAL
// writer waits 10 s between flushes (a commit that did not wait for the WAL stays in memory
// for seconds).
func slowWALCluster(t *testing.T) *crashable {
	t.Helper()
	dir := testenv.ClusterDir(t)
	ctx := context.Background()
	local := startCluster(t, dir)
	pg := &crashable{dir: dir, dsn: local.DSN("postgres"), local: local}
	pool, err := postgres.Connect(ctx, pg.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := postgres.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`alter system set wal_writer_delay = '10s'`, `select pg_reload_conf()`} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return pg
}

// crash stops the postmaster at once (SIGQUIT: nothing more reaches disk), stops d, and starts
// the cluster again (recovering it) with f connected to it.
func (pg *crashable) crash(t *testing.T, f *fixture, d *running) {
	t.Helper()
	pid, ok := pg.local.PID()
	if !ok {
		t.Fatal("no postmaster to crash")
	}
	if err := syscall.Kill(pid, syscall.SIGQUIT); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the postmaster to exit", func() bool { return syscall.Kill(pid, 0) != nil })
	d.stop(t)
	f.pool.Close()
	pg.local = startCluster(t, pg.dir)
	pool, err := postgres.Connect(context.Background(), pg.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	f.pool = pool
}

// startCluster starts (or recovers) the durable cluster kept in dir until the test ends.
func startCluster(t *testing.T, dir string) *postgres.Local {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := postgres.StartLocal(ctx, dir, postgres.LocalConfig{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Stop(context.Background()) })
	return l
}
