package loadtest

import (
	"log/slog"
	"testing"
	"time"

	"carehub/internal/testenv"
)

// TestSelfStackStoresObservationsAndTheirEvents runs a short load on the pipeline that
// `loadtest -self -eventlog postgres` measures: every observation acknowledged is stored, and
// its device.observation_received event reaches the event log, as on a node.
func TestSelfStackStoresObservationsAndTheirEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Postgres and the embedded broker")
	}
	ctx := t.Context()
	st, err := StartStack(ctx, t.TempDir(), slog.New(slog.DiscardHandler), StackOptions{EventLog: "postgres"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rep, err := RunObservations(ctx, Config{URL: st.URL, Keys: []string{st.Key}, Brokers: st.Brokers,
		// MaxRequests ends the load; the duration only bounds it, generously: under the race
		// detector on a loaded CI machine the first requests also pay for the producers'
		// connections (SASL/SCRAM with the embedded broker), and 5 s once saw 18 of the 20.
		Devices: 2, Batch: 10, Format: "mixed", Duration: time.Minute, MaxRequests: 20, Drain: time.Minute,
		NoBaselines: true, CPU: st.CPU})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Accepted != 200 || rep.Failed != 0 || rep.Stored != float64(rep.Accepted) {
		t.Fatalf("accepted %d (want 200), failed %d, stored %.0f", rep.Accepted, rep.Failed, rep.Stored)
	}
	t.Logf("accepted %d, stored %.0f", rep.Accepted, rep.Stored)
	var logged int64
	testenv.Eventually(t, time.Minute, "every observation's event in the log", func() bool {
		err := st.Pool.QueryRow(ctx, `select count(*) from event_log where type = 'device.observation_received'`).Scan(&logged)
		return err == nil && logged == rep.Accepted
	})
}
