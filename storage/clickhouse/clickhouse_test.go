package clickhouse_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"

	"carehub/storage"
	"carehub/storage/clickhouse"
	"carehub/storage/clickhouse/chtest"
	"carehub/storage/storagetest"
)

// newStore opens a store on a database of its own (chtest), dropped when the test ends; without
// a server (CAREHUB_CLICKHOUSE_URL) the test skips.
func newStore(t testing.TB) *clickhouse.Store {
	t.Helper()
	return newStoreAt(t, chtest.NewURL(t))
}

func newStoreAt(t testing.TB, url string) *clickhouse.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, err := clickhouse.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	return store
}

func TestEventLogConformance(t *testing.T) {
	storagetest.TestEventLog(t, func(t *testing.T) storage.EventLog { return newStore(t) })
}

func TestAuditLogConformance(t *testing.T) {
	storagetest.TestAuditLog(t, func(t *testing.T) storage.AuditLog { return newStore(t) })
}

// TestServerSurvivesConnectionReset resets a native-protocol connection after a query, as a node
// killed mid-test does, and checks the server still answers. A non-interactive clickhouse-local
// aborts on it (deploy/local/clickhouse/launcher.c says why and how the launcher avoids it).
func TestServerSurvivesConnectionReset(t *testing.T) {
	dsn := chtest.NewURL(t)
	opts, err := ch.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []*net.TCPConn
	opts.DialContext = func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err == nil {
			mu.Lock()
			conns = append(conns, c.(*net.TCPConn))
			mu.Unlock()
		}
		return c, err
	}
	conn, err := ch.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	for _, c := range conns {
		_ = c.SetLinger(0) // close sends RST
		_ = c.Close()
	}
	mu.Unlock()
	_ = conn.Close()
	// The server handles the reset on its own thread; a crash shows within moments, so keep
	// asking for a while rather than once.
	store := newStoreAt(t, dsn)
	for range 20 {
		if _, err := store.QueryEvents(ctx, storage.EventQuery{ProjectID: "prj_x"}); err != nil {
			t.Fatalf("server gone after a client reset its connection: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
