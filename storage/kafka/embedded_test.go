package kafka_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage/kafka"
)

func startEmbedded(t *testing.T, dir string, cfg kafka.EmbeddedConfig) *kafka.Embedded {
	t.Helper()
	cfg.Logger = testLogger(t)
	e, err := kafka.StartEmbedded(timeout(t, 30*time.Second), dir, cfg)
	if err != nil {
		t.Fatalf("StartEmbedded(%s): %v", dir, err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func embeddedClient(t *testing.T, e *kafka.Embedded, extra ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: e.Addrs(), Credentials: e.Credentials(), ClientID: "embedded-test", Logger: testLogger(t)}, extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// readAll reads every record of topic from the start, without a group, up to
// the end offsets as they are now.
func readAll(t *testing.T, cl *kgo.Client, topic string) []*kgo.Record {
	t.Helper()
	ends, err := kadm.NewClient(cl).ListEndOffsets(timeout(t, 10*time.Second), topic)
	if err != nil {
		t.Fatalf("end offsets: %v", err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	cl.AddConsumeTopics(topic)
	return consume(t, cl, int(n), 30*time.Second)
}

// TestEmbeddedPersists closes and reopens the embedded broker and finds its
// topics, records and committed group offsets.
func TestEmbeddedPersists(t *testing.T) {
	dir := t.TempDir()
	const topic, group = "persist", "persist-group"
	var produced []*kgo.Record
	var committed map[int32]int64

	{
		e := startEmbedded(t, dir, kafka.EmbeddedConfig{})
		cl := embeddedClient(t, e)
		if err := kafka.EnsureTopics(timeout(t, 10*time.Second), cl, kafka.Layout{Partitions: 3}, topic); err != nil {
			t.Fatal(err)
		}
		for i := range 30 {
			produced = append(produced, record(topic, msg{ID: i, Key: fmt.Sprintf("k%d", i%7)}))
		}
		produceSync(t, cl, produced...)

		cons := embeddedClient(t, e, kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit())
		consume(t, cons, 30, 30*time.Second)
		if err := cons.CommitUncommittedOffsets(timeout(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		cons.Close()

		// Produced after the commit: the group owes exactly these.
		var after []*kgo.Record
		for i := 30; i < 42; i++ {
			after = append(after, record(topic, msg{ID: i, Key: fmt.Sprintf("k%d", i%7)}))
		}
		produceSync(t, cl, after...)
		produced = append(produced, after...)

		lags, err := kafka.Lag(timeout(t, 10*time.Second), kadm.NewClient(cl), group, topic)
		if err != nil {
			t.Fatal(err)
		}
		committed = make(map[int32]int64)
		for _, l := range lags {
			committed[l.Partition] = l.Committed
		}
		cl.Close()
		if err := e.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}

	e := startEmbedded(t, dir, kafka.EmbeddedConfig{})
	cl := embeddedClient(t, e)
	adm := kadm.NewClient(cl)
	md, err := adm.ListTopics(timeout(t, 10*time.Second), topic)
	if err != nil || md[topic].Err != nil || len(md[topic].Partitions) != 3 {
		t.Fatalf("after reopen, topic %s: %+v %v", topic, md[topic], err)
	}

	got := readAll(t, cl, topic)
	ids := idSet(t, got)
	if len(got) != len(produced) || len(ids) != len(produced) {
		t.Fatalf("after reopen read %d records (%d distinct ids), produced %d", len(got), len(ids), len(produced))
	}

	lags, err := kafka.Lag(timeout(t, 10*time.Second), adm, group, topic)
	if err != nil {
		t.Fatal(err)
	}
	if total := kafka.TotalLag(lags); total != 12 {
		t.Errorf("after reopen the group owes %d records, want 12: %+v", total, lags)
	}
	for _, l := range lags {
		if l.Committed != committed[l.Partition] {
			t.Errorf("partition %d committed %d after reopen, %d before", l.Partition, l.Committed, committed[l.Partition])
		}
	}

	// The group resumes where it committed.
	cons := embeddedClient(t, e, kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit())
	for _, r := range consume(t, cons, 12, 30*time.Second) {
		if m := decode(t, r); m.ID < 30 {
			t.Errorf("resumed group re-read id %d", m.ID)
		}
	}
}

func idSet(t testing.TB, recs []*kgo.Record) map[int]int {
	ids := make(map[int]int)
	for _, r := range recs {
		ids[decode(t, r).ID]++
	}
	return ids
}

func TestEmbeddedLocksDataDir(t *testing.T) {
	dir := t.TempDir()
	e := startEmbedded(t, dir, kafka.EmbeddedConfig{})
	if e2, err := kafka.StartEmbedded(timeout(t, 10*time.Second), dir, kafka.EmbeddedConfig{}); !errors.Is(err, kafka.ErrDataDirLocked) {
		if err == nil {
			e2.Close()
		}
		t.Fatalf("second StartEmbedded on a dir in use: %v, want ErrDataDirLocked", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	// Released by Close.
	startEmbedded(t, dir, kafka.EmbeddedConfig{})
}

func TestEmbeddedPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	e := startEmbedded(t, t.TempDir(), kafka.EmbeddedConfig{Port: port})
	want := "127.0.0.1:" + strconv.Itoa(port)
	if addrs := e.Addrs(); len(addrs) != 1 || addrs[0] != want {
		t.Fatalf("Addrs() = %v, want [%s]", addrs, want)
	}
	if err := kafka.Ping(timeout(t, 10*time.Second), embeddedClient(t, e)); err != nil {
		t.Error(err)
	}
}

// The kill -9 test runs this binary again as a child that owns the embedded
// broker, and kills it.
const (
	crashChildEnv = "CAREHUB_KAFKA_CRASH_CHILD_DIR"
	crashRoundEnv = "CAREHUB_KAFKA_CRASH_ROUND"
	crashTopic    = "crash"
	crashGroup    = "crash-group"
	crashRecords  = 200
)

// crashReport is what a child prints once its records are acknowledged and
// its offsets committed, just before it is killed.
type crashReport struct {
	Acked []int // ids of records the broker acknowledged (acks=all)
	Read  int   // records the group read this round
	Stale int   // of those, records from earlier rounds (committed before the kill)
}

// crashChild is the child's main: start the embedded broker on the dir
// (recovering it if the last child was killed), produce, consume and commit
// with a group, report, and wait to be killed.
func crashChild() int {
	dir := os.Getenv(crashChildEnv)
	round, _ := strconv.Atoi(os.Getenv(crashRoundEnv))
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	fail := func(err error) int {
		logger.Error("crash child", "err", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	e, err := kafka.StartEmbedded(ctx, dir, kafka.EmbeddedConfig{Logger: logger})
	if err != nil {
		return fail(err)
	}
	cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: e.Addrs(), Credentials: e.Credentials(), Logger: logger})
	if err != nil {
		return fail(err)
	}
	if err := kafka.EnsureTopics(ctx, cl, kafka.Layout{Partitions: 3}, crashTopic); err != nil {
		return fail(err)
	}
	var rep crashReport
	var recs []*kgo.Record
	for i := range crashRecords {
		recs = append(recs, record(crashTopic, msg{ID: round*1000 + i, Key: fmt.Sprintf("k%d", i%11)}))
	}
	for _, res := range cl.ProduceSync(ctx, recs...) {
		if res.Err != nil {
			return fail(res.Err)
		}
		var m msg
		_ = json.Unmarshal(res.Record.Value, &m)
		rep.Acked = append(rep.Acked, m.ID)
	}

	cons, err := kafka.NewClient(kafka.ClientConfig{Brokers: e.Addrs(), Credentials: e.Credentials(), ClientID: "crash-consumer", Logger: logger},
		kgo.ConsumerGroup(crashGroup), kgo.ConsumeTopics(crashTopic), kgo.DisableAutoCommit())
	if err != nil {
		return fail(err)
	}
	for rep.Read < crashRecords {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fail(fmt.Errorf("read %d of %d: %w", rep.Read, crashRecords, err))
		}
		for _, r := range fs.Records() {
			var m msg
			_ = json.Unmarshal(r.Value, &m)
			rep.Read++
			if m.ID/1000 != round {
				rep.Stale++
			}
		}
	}
	if err := cons.CommitUncommittedOffsets(ctx); err != nil {
		return fail(err)
	}
	out, _ := json.Marshal(rep)
	fmt.Printf("READY %s\n", out)
	select {} // until SIGKILL: no Close, no flush, no clean shutdown
}

// runCrashChild runs one child round on dir, kills it with SIGKILL once it
// reports, and returns its report.
func runCrashChild(t *testing.T, dir string, round int) crashReport {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, crashRoundEnv+"="+strconv.Itoa(round))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	watchdog := time.AfterFunc(90*time.Second, func() { _ = cmd.Process.Kill() })
	defer watchdog.Stop()

	var rep crashReport
	var ready bool
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
			if err := json.Unmarshal([]byte(line), &rep); err != nil {
				t.Fatalf("child report %q: %v", line, err)
			}
			ready = true
			break
		}
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	if !ready {
		t.Fatalf("crash child round %d exited without reporting; stderr:\n%s", round, stderr.String())
	}
	if len(rep.Acked) != crashRecords {
		t.Fatalf("round %d acknowledged %d records, want %d", round, len(rep.Acked), crashRecords)
	}
	return rep
}

// tearTail appends a partial entry to a file, as a process killed in the
// middle of a write would leave it.
func tearTail(t *testing.T, path string, junk []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatalf("tear %s (did kfake's file layout change?): %v", path, err)
	}
	defer f.Close()
	if _, err := f.Write(junk); err != nil {
		t.Fatal(err)
	}
}

// TestEmbeddedRecoversFromKill kills a process serving the embedded broker
// with SIGKILL, twice, with torn writes in between, and checks that the next
// start needs no cleanup and keeps every acknowledged record and every
// committed offset.
func TestEmbeddedRecoversFromKill(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns and kills child processes")
	}
	dir := t.TempDir()

	r0 := runCrashChild(t, dir, 0)

	// Torn tails: a partial framed entry in the group log (4-byte length
	// promising more than follows) and a partial record batch in a segment
	// (batch length pointing past the end).
	tearTail(t, filepath.Join(dir, "groups.log"), []byte{0x40, 0, 0, 0, 1, 2, 3})
	segs, _ := filepath.Glob(filepath.Join(dir, "partitions", "*", "*.dat"))
	if len(segs) == 0 {
		t.Fatalf("no segment files under %s/partitions (did kfake's file layout change?)", dir)
	}
	tearTail(t, segs[0], []byte{0, 0, 0, 0, 0, 0, 0, 99, 0, 0, 0x10, 0, 7, 7, 7, 7})

	r1 := runCrashChild(t, dir, 1)
	if r1.Read != crashRecords || r1.Stale != 0 {
		t.Errorf("after the first kill the group read %d records, %d of them committed before the kill; want %d and 0",
			r1.Read, r1.Stale, crashRecords)
	}

	e := startEmbedded(t, dir, kafka.EmbeddedConfig{})
	cl := embeddedClient(t, e)
	ids := idSet(t, readAll(t, cl, crashTopic))
	for _, id := range append(r0.Acked, r1.Acked...) {
		if ids[id] != 1 {
			t.Errorf("acknowledged id %d read %d times after two kills", id, ids[id])
		}
	}
	if len(ids) != 2*crashRecords {
		t.Errorf("read %d distinct ids, acknowledged %d", len(ids), 2*crashRecords)
	}
	lags, err := kafka.Lag(timeout(t, 10*time.Second), kadm.NewClient(cl), crashGroup, crashTopic)
	if err != nil {
		t.Fatal(err)
	}
	if total := kafka.TotalLag(lags); total != 0 {
		t.Errorf("group offsets committed before the second kill were lost: lag %d: %+v", total, lags)
	}
}
