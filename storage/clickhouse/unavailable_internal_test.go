package clickhouse

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"

	"carehub/internal/testenv"
	"carehub/kernel/events"
	"carehub/kernel/fault"
	"carehub/storage"
)

// A store whose server cannot be reached answers every read with a 503-kind error naming
// ClickHouse, not an internal one; the server's own refusals stay what they are.
func TestUnreachableServerIsUnavailable(t *testing.T) {
	opts, err := ch.ParseDSN("clickhouse://" + testenv.FreeAddr(t) + "/default?dial_timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := ch.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	s := &Store{conn: readRetry{conn}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	day := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for name, call := range map[string]func() error{
		"ping": func() error { return s.Ping(ctx) },
		"events": func() error {
			_, err := s.QueryEvents(ctx, storage.EventQuery{OrgID: "org_1", ProjectID: "prj_1"})
			return err
		},
		"export": func() error {
			return s.ExportEvents(ctx, storage.EventQuery{OrgID: "org_1", ProjectID: "prj_1"}, func([]events.Event) error { return nil })
		},
		"stats": func() error {
			_, err := s.AggregateEvents(ctx, storage.AggregateQuery{OrgID: "org_1", ProjectID: "prj_1", GroupBy: storage.GroupType,
				Bucket: storage.BucketNone, From: day, To: day.Add(time.Hour)})
			return err
		},
		"audit": func() error {
			_, err := s.QueryAudit(ctx, storage.AuditQuery{OrgID: "org_1"})
			return err
		},
	} {
		err := call()
		f := fault.As(err)
		if f == nil || f.Kind != fault.KindUnavailable || f.Details["dependency"] != "clickhouse" {
			t.Errorf("%s: %v (%#v), want KindUnavailable naming clickhouse", name, err, f)
		}
	}

	for _, err := range []error{
		fmt.Errorf("query: %w", &proto.Exception{Code: 60, Message: "table does not exist"}),
		context.Canceled,
		errors.New("aggregate events: unknown grouping"),
	} {
		if fault.KindOf(unavailable(err)) == fault.KindUnavailable {
			t.Errorf("%v classified as unavailable", err)
		}
	}
}
