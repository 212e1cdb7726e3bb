package servertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
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
// LSO behind the end is a transaction still open), each consumer group's state, members and
// committed offsets, and the open transactions. "Accepted but never stored" failures are told
// apart by it: an LSO held back, a group that never assigned its partitions, or a member that
// has its partitions and does not move. (A group that has read everything of a partition ending
// in a transaction's commit marker has committed one before the end: the marker is no record.)
func (s *Server) diagnose(t testing.TB) {
	if dir := os.Getenv(EnvDumpDir); dir != "" {
		name := filepath.Join(dir, "servertest-"+strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())+".txt")
		if f, err := os.Create(name); err == nil {
			_ = pprof.Lookup("goroutine").WriteTo(f, 2)
			f.Close()
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
	t.Log(b.String())
}

func errSuffix(errs ...error) string {
	for _, err := range errs {
		if err != nil {
			return " (" + err.Error() + ")"
		}
	}
	return ""
}
