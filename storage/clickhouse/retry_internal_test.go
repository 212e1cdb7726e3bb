package clickhouse

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"

	"carehub/storage"
	"carehub/storage/clickhouse/chtest"
)

// TestReadsSurviveABrokenConnection breaks the store's first connection after its handshake,
// as the driver did once in CI: the next read on it fails with "use of closed network
// connection" before its first block. The page and its total must still come back, read on
// another connection. (Without readRetry, QueryEvents fails.)
func TestReadsSurviveABrokenConnection(t *testing.T) {
	dsn := chtest.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	migrated, err := Open(ctx, dsn, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer migrated.Close()

	opts, err := ch.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	first := &breakingConn{}
	var dials atomic.Int32
	opts.DialContext = func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil || dials.Add(1) > 1 {
			return c, err
		}
		first.Conn = c
		return first, nil
	}
	conn, err := ch.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Ping(ctx); err != nil { // the first connection, its handshake done
		t.Fatal(err)
	}
	first.broken.Store(true)
	s := &Store{conn: readRetry{conn}}
	defer s.Close()

	for _, total := range []storage.TotalMode{storage.TotalExact, storage.TotalEstimate} {
		if _, err := s.QueryEvents(ctx, storage.EventQuery{ProjectID: "prj_retry", Total: total}); err != nil {
			t.Fatalf("a read on a broken pooled connection failed: %v", err)
		}
	}
	if dials.Load() < 2 {
		t.Fatalf("%d connections dialled: the broken one was not replaced", dials.Load())
	}
}

// breakingConn closes itself on the first read once broken is set.
type breakingConn struct {
	net.Conn
	broken atomic.Bool
}

func (c *breakingConn) Read(b []byte) (int, error) {
	if c.broken.Load() {
		_ = c.Conn.Close()
	}
	return c.Conn.Read(b)
}
