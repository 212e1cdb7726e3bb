package publish_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage/kafka"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/kafka/publish"
	"carehub/storage/kafka/publish/publishtest"
)

// client returns an idempotent producer of kafka.NewClient on brokers, closed when t ends.
func client(t *testing.T, brokers []string, extra ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: brokers, ClientID: "publishtest"}, extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// acked returns a publishtest.Route over one of Acked's ways of waiting.
func acked(send func(a *publish.Acked, ctx context.Context, recs []*kgo.Record) error) func(*testing.T, []string) publishtest.Route {
	return func(t *testing.T, brokers []string) publishtest.Route {
		cl := client(t, brokers)
		a := publish.NewAcked(cl)
		return publishtest.Route{
			Publish: func(ctx context.Context, recs []*kgo.Record) error { return send(a, ctx, recs) },
			Close:   cl.Close,
		}
	}
}

func TestAckedAll(t *testing.T) {
	t.Parallel()
	publishtest.TestRoute(t, acked(func(a *publish.Acked, ctx context.Context, recs []*kgo.Record) error {
		return a.All(ctx, recs...)
	}))
}

func TestAckedEach(t *testing.T) {
	t.Parallel()
	publishtest.TestRoute(t, acked(func(a *publish.Acked, ctx context.Context, recs []*kgo.Record) error {
		return errors.Join(a.Each(ctx, recs)()...)
	}))
}

func TestAckedWithin(t *testing.T) {
	t.Parallel()
	publishtest.TestRoute(t, acked(func(a *publish.Acked, ctx context.Context, recs []*kgo.Record) error {
		for _, r := range recs {
			if err := a.Within(ctx, 10*time.Second, r); err != nil {
				return err
			}
		}
		return nil
	}))
}

// TestAckedGo waits as the audit publisher's PublishSync does: for the promise or ctx.
func TestAckedGo(t *testing.T) {
	t.Parallel()
	publishtest.TestRoute(t, acked(func(a *publish.Acked, ctx context.Context, recs []*kgo.Record) error {
		done := make(chan error, len(recs))
		for _, r := range recs {
			a.Go(r, func(_ *kgo.Record, err error) { done <- err })
		}
		for range recs {
			select {
			case err := <-done:
				if err != nil {
					return err
				}
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}))
}

// TestAckedGoDropsWhenFull: with the buffer full (a broker that never answers holds the first
// record), Go fails the next record at once with kgo.ErrMaxBuffered instead of queueing it.
func TestAckedGoDropsWhenFull(t *testing.T) {
	t.Parallel()
	a := publish.NewAcked(client(t, []string{"127.0.0.1:1"}, kgo.MaxBufferedRecords(1)))
	a.Go(&kgo.Record{Topic: "t", Value: []byte("held")}, func(*kgo.Record, error) {})
	dropped := make(chan error, 1)
	a.Go(&kgo.Record{Topic: "t", Value: []byte("dropped")}, func(_ *kgo.Record, err error) { dropped <- err })
	select {
	case err := <-dropped:
		if !errors.Is(err, kgo.ErrMaxBuffered) {
			t.Fatalf("second record: %v, want kgo.ErrMaxBuffered", err)
		}
	case <-time.After(time.Second):
		t.Fatal("second record neither queued nor dropped after 1s")
	}
}

func TestTransactional(t *testing.T) {
	t.Parallel()
	publishtest.TestRoute(t, func(t *testing.T, brokers []string) publishtest.Route {
		p := publish.NewTransactional(publish.TransactionalConfig{Brokers: brokers, Prefix: kafkatest.Name(t, "publishtest-txn"),
			ClientID: "publishtest", TxnTimeout: 30 * time.Second})
		t.Cleanup(p.Close)
		add := func(ctx context.Context, recs []*kgo.Record) (*publish.Txn, error) {
			txn, err := p.Acquire(ctx)
			if err != nil {
				return nil, err
			}
			if err := txn.Add(ctx, recs...); err != nil {
				txn.Abort()
				return nil, err
			}
			return txn, nil
		}
		return publishtest.Route{
			Publish: func(ctx context.Context, recs []*kgo.Record) error {
				txn, err := add(ctx, recs)
				if err != nil {
					return err
				}
				return txn.Commit(ctx)
			},
			Abort: func(ctx context.Context, recs []*kgo.Record) error {
				txn, err := add(ctx, recs)
				if err != nil {
					return err
				}
				defer txn.Abort()
				return txn.Flush(ctx)
			},
			Close:       p.Close,
			Grace:       6 * time.Second,  // Txn.Abort's own bound, 5 s
			SilentGrace: 60 * time.Second, // BeginTransaction's, see publishtest.Route
		}
	})
}

// TestGroupTxn drives the route as consume.Transact's Transaction middleware does: begin, publish
// through the route, end (committing or aborting) on a context of its own.
func TestGroupTxn(t *testing.T) {
	t.Parallel()
	publishtest.TestRoute(t, func(t *testing.T, brokers []string) publishtest.Route {
		sess, err := kafka.NewGroupTransactSession(kafka.ClientConfig{Brokers: brokers, ClientID: "publishtest"},
			kgo.ConsumerGroup(kafkatest.Group(t, "publishtest")), kgo.TransactionalID(kafkatest.Name(t, "publishtest-txn")),
			kgo.TransactionTimeout(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sess.Close)
		inTxn := func(ctx context.Context, recs []*kgo.Record, commit bool) error {
			if err := sess.Begin(); err != nil {
				return err
			}
			err := publish.NewGroupTxn(sess).All(ctx, recs...)
			ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			committed, endErr := sess.End(ectx, kgo.TransactionEndTry(commit && err == nil))
			switch {
			case err != nil || endErr != nil:
				return errors.Join(err, endErr)
			case commit && !committed:
				return errors.New("transaction not committed")
			}
			return nil
		}
		return publishtest.Route{
			Publish:     func(ctx context.Context, recs []*kgo.Record) error { return inTxn(ctx, recs, true) },
			Abort:       func(ctx context.Context, recs []*kgo.Record) error { return inTxn(ctx, recs, false) },
			Close:       sess.Close,
			Grace:       6 * time.Second,  // End's own bound, 5 s
			SilentGrace: 60 * time.Second, // Begin's, see publishtest.Route
		}
	})
}
