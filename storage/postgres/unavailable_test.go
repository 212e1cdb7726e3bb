package postgres_test

import (
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/fault"
	"carehub/storage"
	"carehub/storage/postgres"
)

// TestUnreachableStoreIsUnavailable reads the event and audit log from a Postgres that is not
// there: each read is a 503-kind fault naming Postgres (issue 58), not an error the API answers
// 500.
func TestUnreachableStoreIsUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	cfg, err := pgxpool.ParseConfig("postgres://carehub@" + addr + "/carehub?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	events, audit := postgres.NewEventLog(pool), postgres.NewAuditLog(pool)
	_, qerr := events.QueryEvents(t.Context(), storage.EventQuery{ProjectID: "prj_1"})
	_, aerr := events.AggregateEvents(t.Context(), storage.AggregateQuery{ProjectID: "prj_1", From: time.Now().Add(-time.Hour), To: time.Now()})
	_, uerr := audit.QueryAudit(t.Context(), storage.AuditQuery{OrgID: "org_1"})
	for name, err := range map[string]error{"QueryEvents": qerr, "AggregateEvents": aerr, "QueryAudit": uerr} {
		f := fault.As(err)
		if f == nil || f.Kind != fault.KindUnavailable || f.Details["dependency"] != postgres.Dependency {
			t.Errorf("%s with Postgres unreachable: %v, want a 503 naming postgres", name, err)
		}
	}
}
