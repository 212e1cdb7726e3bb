package servertest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// EnvDumpDir names a directory where a failed test's goroutines are written
// (servertest-<test>.txt) besides the Kafka state in its log.
const EnvDumpDir = "CAREHUB_TEST_DUMP_DIR"

// diagnose logs, for a failed test, where the node's records stand in Kafka: per topic and
// partition the end offset and the last stable offset (read committed consumers stop there: an
// LSO behind the end is a transaction still open), the records a read-committed and a
// read-uncommitted reader see (fewer committed than written: a transaction aborted), each
// consumer group's state, members and committed offsets, the open transactions, the database's
// sessions that are not idle, and where each consumer's loop is. "Accepted but never stored"
// failures are told apart by it: an LSO held back, a record aborted, a group that never
// assigned its partitions, or a member that has its partitions and does not move, with the
// stack it waits in (a fetch, or a statement waiting on a lock). (A group that has read everything
// of a partition ending in a transaction's commit marker has committed one before the end: the
// marker is no record.)
func (s *Server) diagnose(t testing.TB) {
	var dump bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&dump, 2)
	if dir := os.Getenv(EnvDumpDir); dir != "" {
		name := filepath.Join(dir, "servertest-"+strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())+".txt")
		if err := os.WriteFile(name, dump.Bytes(), 0o644); err == nil {
			t.Logf("servertest: goroutines in %s", name)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Node.Brokers()...))
	if err != nil {
		t.Logf("servertest: kafka state: %v", err)
		return
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var b strings.Builder
	topics := s.Node.Topics().All()
	ends, err1 := adm.ListEndOffsets(ctx, topics...)
	stable, err2 := adm.ListCommittedOffsets(ctx, topics...)
	fmt.Fprintf(&b, "servertest: kafka state at the failure (end / last stable offset per partition)%s\n", errSuffix(err1, err2))
	for _, topic := range topics {
		fmt.Fprintf(&b, "  %s:", topic)
		for p := int32(0); ; p++ {
			e, ok := ends.Lookup(topic, p)
			if !ok {
				break
			}
			st, _ := stable.Lookup(topic, p)
			mark := ""
			if st.Offset != e.Offset {
				mark = " (held)"
			}
			fmt.Fprintf(&b, " p%d %d/%d%s", p, e.Offset, st.Offset, mark)
		}
		b.WriteString("\n")
	}
	groups := nodeGroups(s.cfg.KafkaNamespace)
	described, err := adm.DescribeGroups(ctx, groups...)
	fmt.Fprintf(&b, "  groups%s:\n", errSuffix(err))
	for _, g := range groups {
		d := described[g]
		fmt.Fprintf(&b, "    %s %s, %d members", g, d.State, len(d.Members))
		for _, m := range d.Members {
			if a, ok := m.Assigned.AsConsumer(); ok {
				for _, at := range a.Topics {
					fmt.Fprintf(&b, " [%s %v]", at.Topic, at.Partitions)
				}
			}
		}
		offs, err := adm.FetchOffsets(ctx, g)
		fmt.Fprintf(&b, "; committed%s:", errSuffix(err))
		offs.Each(func(o kadm.OffsetResponse) { fmt.Fprintf(&b, " %s/%d=%d", o.Topic, o.Partition, o.At) })
		b.WriteString("\n")
	}
	txns, err := adm.ListTransactions(ctx, nil, []string{"Ongoing", "PrepareCommit", "PrepareAbort"})
	fmt.Fprintf(&b, "  transactions not ended (on a shared broker, any test's)%s:", errSuffix(err))
	for _, tx := range txns.Sorted() {
		fmt.Fprintf(&b, " %s=%s", tx.TxnID, tx.State)
	}
	b.WriteString("\n")
	committed := s.readable(ctx, ends, kgo.ReadCommitted())
	all := s.readable(ctx, ends, kgo.ReadUncommitted())
	b.WriteString("  records read committed / written:")
	for _, topic := range topics {
		for p := int32(0); ; p++ {
			if _, ok := ends.Lookup(topic, p); !ok {
				break
			}
			if n := all[topic][p]; n > 0 {
				fmt.Fprintf(&b, " %s/%d %d/%d", topic, p, committed[topic][p], n)
			}
		}
	}
	b.WriteString("\n")
	s.sessions(ctx, &b)
	b.WriteString("  consumer loops:\n")
	for _, g := range strings.Split(dump.String(), "\n\n") {
		if strings.Contains(g, "consume.(*Runner).Run(") {
			b.WriteString(indent(consumerStack(g), "    "))
		}
	}
	t.Log(b.String())
}

// sessions writes the database's sessions that are not idle: what each waits on (a lock, I/O),
// for how long its transaction has been open, and the start of its statement.
func (s *Server) sessions(ctx context.Context, b *strings.Builder) {
	rows, err := s.Pool().Query(ctx, `
select pid, coalesce(application_name, ''), state, coalesce(wait_event_type || ':' || wait_event, ''),
	coalesce(extract(epoch from now() - xact_start), 0)::float8, left(regexp_replace(query, '\s+', ' ', 'g'), 100)
from pg_stat_activity
where datname = current_database() and pid <> pg_backend_pid() and state is distinct from 'idle'`)
	if err != nil {
		fmt.Fprintf(b, "  database sessions (%v)\n", err)
		return
	}
	defer rows.Close()
	b.WriteString("  database sessions not idle:\n")
	for rows.Next() {
		var (
			pid              int32
			app, state, wait string
			xact             float64
			query            string
		)
		if err := rows.Scan(&pid, &app, &state, &wait, &xact, &query); err != nil {
			fmt.Fprintf(b, "    (%v)\n", err)
			return
		}
		fmt.Fprintf(b, "    %d %s %s wait=%s xact=%.1fs: %s\n", pid, app, state, wait, xact, query)
	}
}

// readable counts the records of each partition with data that a reader at isolation level
// sees, reading from the start until a poll brings nothing new.
func (s *Server) readable(ctx context.Context, ends kadm.ListedOffsets, level kgo.IsolationLevel) map[string]map[int32]int {
	parts := map[string]map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			if parts[o.Topic] == nil {
				parts[o.Topic] = map[int32]kgo.Offset{}
			}
			parts[o.Topic][o.Partition] = kgo.NewOffset().AtStart()
		}
	})
	out := map[string]map[int32]int{}
	if len(parts) == 0 {
		return out
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Node.Brokers()...), kgo.ConsumePartitions(parts),
		kgo.FetchIsolationLevel(level), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		return out
	}
	defer cl.Close()
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fetches := cl.PollFetches(pctx)
		cancel()
		if fetches.NumRecords() == 0 {
			break
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if out[r.Topic] == nil {
				out[r.Topic] = map[int32]int{}
			}
			out[r.Topic][r.Partition]++
		})
	}
	return out
}

// consumerStack shortens a consumer loop's goroutine from a debug=2 dump to its header (state
// and how long it has waited), the four innermost frames (where it waits) and, from the
// runner's frame, two frames outward (which consumer it is). A frame is two lines: the call
// and its file:line.
func consumerStack(g string) string {
	lines := strings.Split(strings.TrimSpace(g), "\n")
	run := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, "consume.(*Runner).Run(") })
	top := min(1+2*4, run)
	out := append(lines[:top:top], "...")
	if run == top {
		out = out[:top]
	}
	return strings.Join(append(out, lines[run:min(run+2*3, len(lines))]...), "\n") + "\n"
}

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+prefix) + "\n"
}

func errSuffix(errs ...error) string {
	for _, err := range errs {
		if err != nil {
			return " (" + err.Error() + ")"
		}
	}
	return ""
}
