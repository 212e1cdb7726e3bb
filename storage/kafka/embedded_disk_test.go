package kafka_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/internal/testenv"
	"carehub/storage/kafka"
)

// TestEmbeddedRefusesCommitsOnFullDisk fills the embedded broker's disk (a tmpfs) between a
// transaction's produce and its commit: the commit is refused (kfake alone acknowledges it
// without writing its markers, and a restart then aborts it), DiskFull says why, and once the
// space returns a transaction commits and only it is read committed.
func TestEmbeddedRefusesCommitsOnFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root to mount a tmpfs as the full disk")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", dir).CombinedOutput(); err != nil {
		testenv.Missing(t, "cannot mount a tmpfs: %v: %s", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if exec.Command("umount", dir).Run() != nil {
			_ = exec.Command("umount", "-l", dir).Run()
		}
	})
	e := startEmbedded(t, filepath.Join(dir, "kafka"), kafka.EmbeddedConfig{DiskReserve: 8 << 20})
	const topic = "diskfull"
	admin := embeddedClient(t, e)
	if err := kafka.EnsureTopics(timeout(t, 10*time.Second), admin, kafka.Layout{Partitions: 1}, topic); err != nil {
		t.Fatal(err)
	}
	txn := embeddedClient(t, e, kgo.TransactionalID("diskfull-txn"))
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	produceSync(t, txn, record(topic, msg{ID: 1}))

	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for _, chunk := range []int{1 << 20, 4096} {
		for buf := make([]byte, chunk); ; {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
	}
	_ = f.Close()
	testenv.Eventually(t, 10*time.Second, "DiskFull", func() bool { return errors.Is(e.DiskFull(), kafka.ErrDiskFull) })
	t.Logf("DiskFull: %v", e.DiskFull())

	if err := txn.EndTransaction(timeout(t, 10*time.Second), kgo.TryCommit); err == nil {
		t.Fatal("a transaction committed on a full disk, its markers unwritten")
	}
	if err := txn.EndTransaction(timeout(t, 10*time.Second), kgo.TryAbort); err != nil {
		t.Fatalf("abort: %v", err)
	}
	if err := txn.ProduceSync(timeout(t, 10*time.Second), record(topic, msg{ID: 2})).FirstErr(); err == nil {
		t.Fatal("a record produced on a full disk")
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "DiskFull nil once space returned", func() bool { return e.DiskFull() == nil })
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	produceSync(t, txn, record(topic, msg{ID: 3}))
	if err := txn.EndTransaction(timeout(t, 10*time.Second), kgo.TryCommit); err != nil {
		t.Fatalf("commit once space returned: %v", err)
	}
	reader := embeddedClient(t, e, kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeTopics(topic))
	got := consume(t, reader, 1, 30*time.Second)
	if id := decode(t, got[0]).ID; len(got) != 1 || id != 3 {
		t.Fatalf("read committed %d records, first %d; want only record 3", len(got), id)
	}
}
