package pipelinetest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"carehub/e2e/pipelinetest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// The crash load: crashRounds times, start carehub, run crashWorkers clients, each with a key
// of its own, each publishing at most crashRate events per second (under the per-key limit of
// 50/s, so no call is refused for rate), for crashBefore; SIGKILL carehub and let the clients
// run into the dead server for crashAfter more. Client 0 publishes arrays of crashBatch events
// (POST /v1/events, straight to Kafka in a transaction), the others one event a call
// (publishEvent, straight to Kafka as one record).
const (
	crashRounds  = 3
	crashWorkers = 4
	crashRate    = 40
	crashBatch   = 10
	crashBefore  = 3 * time.Second
	crashAfter   = 500 * time.Millisecond
)

// TestCrashMidLoad is the crash acceptance, on the real binary in its default embedded mode
// (its own Postgres cluster and kfake broker under the data dir; a crash of the whole process is
// the point): publishEvent load from several clients, SIGKILL of carehub in the middle of it,
// restart on the same data dir, three times over. Every event whose publish returned success
// must then be in GET /v1/events exactly once; no event may be there that no call published.
// Calls that failed (cut by the kill) may or may not have left their event; they are counted.
func TestCrashMidLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs the carehub binary")
	}
	bin := buildCarehub(t)
	dir := filepath.Join(t.TempDir(), "data") // the embedded Postgres's user must traverse it
	addr := freeAddr(t)
	// A killed carehub leaves its Postgres running for the next start to reuse; if the test
	// ends between a kill and the restart, start once more just to stop it.
	orphaned := false
	t.Cleanup(func() {
		if orphaned {
			startNode(t, bin, dir, addr).terminate(t)
		}
	})
	n := startNode(t, bin, dir, addr)
	keys := make([]string, crashWorkers+1)
	for i := range keys {
		keys[i] = createKey(t, bin, dir, access.ExecWorkflows)
	}
	reader := &pipelinetest.Client{BaseURL: n.url(), Key: keys[crashWorkers], HTTP: &http.Client{Timeout: 30 * time.Second}}
	project := sepsisProject(t, reader)
	typ := uniqueType(t, "crash")

	type call struct {
		worker, seq int // worker is round*crashWorkers + client
		id          string
		err         error // nil: acknowledged
		batch       int   // the array call of client 0 that carried the event (seq / crashBatch)
	}
	var (
		mu    sync.Mutex
		calls []call
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var rounds []string
	for round := range crashRounds {
		if round > 0 {
			n = startNode(t, bin, dir, addr)
			orphaned = false
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range crashWorkers {
			worker := round*crashWorkers + w
			c := &pipelinetest.Client{BaseURL: n.url(), Key: keys[w], HTTP: &http.Client{Timeout: 10 * time.Second}}
			batch := 1
			if w == 0 {
				batch = crashBatch
			}
			wg.Go(func() {
				tick := time.NewTicker(time.Second * time.Duration(batch) / crashRate)
				defer tick.Stop()
				for b := 0; ; b++ {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					var ps []pipelinetest.Published
					var err error
					if batch == 1 {
						var p pipelinetest.Published
						p, err = c.Publish(ctx, project, typ, payload{Worker: worker, Seq: b})
						ps = []pipelinetest.Published{p}
					} else {
						drafts := make([]pipelinetest.Draft, batch)
						for j := range drafts {
							drafts[j] = pipelinetest.Draft{Type: typ, Payload: payload{Worker: worker, Seq: b*batch + j}}
						}
						ps, err = c.PublishBatch(ctx, project, drafts)
					}
					mu.Lock()
					for j := range batch {
						cl := call{worker: worker, seq: b*batch + j, err: err, batch: b}
						if err == nil {
							cl.id = ps[j].ID
						}
						calls = append(calls, cl)
					}
					mu.Unlock()
				}
			})
		}
		time.Sleep(crashBefore)
		n.kill(t)
		orphaned = true
		time.Sleep(crashAfter)
		close(stop)
		wg.Wait()
		mu.Lock()
		ok, failed := 0, 0
		for _, c := range calls {
			if c.worker/crashWorkers != round {
				continue
			}
			if c.err == nil {
				ok++
			} else {
				failed++
			}
		}
		mu.Unlock()
		rounds = append(rounds, fmt.Sprintf("round %d: %d ok, %d failed", round+1, ok, failed))
		if ok == 0 {
			t.Fatalf("round %d: no publish succeeded before the kill", round+1)
		}
	}

	acked := map[string]call{}
	attempted := map[[2]int]call{}
	var failed, rateLimited int
	for _, c := range calls {
		attempted[[2]int{c.worker, c.seq}] = c
		switch _, limited := pipelinetest.RateLimited(c.err); {
		case c.err == nil:
			acked[c.id] = c
		case limited:
			rateLimited++
		default:
			failed++
		}
	}
	if rateLimited > 0 {
		t.Errorf("%d calls were rate limited: the load is meant to stay under the per-key limit", rateLimited)
	}
	for _, c := range calls {
		var se *pipelinetest.StatusError
		if errors.As(c.err, &se) && se.Status != http.StatusTooManyRequests {
			t.Errorf("worker %d seq %d: the server answered an error, not a cut connection: %v", c.worker, c.seq, c.err)
		}
	}

	restarted := time.Now()
	n = startNode(t, bin, dir, addr)
	orphaned = false
	t.Logf("%s; restarted and ready in %v", strings.Join(rounds, "; "), time.Since(restarted).Round(time.Millisecond))
	ids := make([]string, 0, len(acked))
	for id := range acked {
		ids = append(ids, id)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for visible(t, reader, project, typ, ids) < len(ids) {
		if time.Now().After(deadline) {
			break // the comparison below names what is missing
		}
		time.Sleep(200 * time.Millisecond)
	}
	caughtUp := time.Since(restarted)

	// Small pages: the cursor walk is part of what must serve each event once.
	lc := readLog(t, reader, project, typ, 50)
	missing, unacked, phantoms := 0, 0, 0
	present := map[[2]int]int{} // events in the log per array call (worker, batch) that failed
	for id, c := range acked {
		if _, ok := lc.byID[id]; !ok {
			missing++
			if missing <= 10 {
				t.Errorf("event %s (worker %d seq %d) was acknowledged but is not in the log", id, c.worker, c.seq)
			}
		}
	}
	for id, ev := range lc.byID {
		p := decodePayload(t, ev)
		c, ok := attempted[[2]int{p.Worker, p.Seq}]
		switch {
		case !ok:
			phantoms++
			t.Errorf("event %s (worker %d seq %d) is in the log, but no call published it", id, p.Worker, p.Seq)
		case c.err == nil && c.id != id:
			phantoms++
			t.Errorf("event %s carries worker %d seq %d, which was acknowledged as %s", id, p.Worker, p.Seq, c.id)
		case c.err != nil:
			unacked++
			if c.worker%crashWorkers == 0 {
				present[[2]int{c.worker, c.batch}]++
			}
		}
	}
	for b, n := range present {
		if n != crashBatch {
			t.Errorf("worker %d's array %d failed and left %d of its %d events in the log: all or none", b[0], b[1], n, crashBatch)
		}
	}
	t.Logf("published: %d calls, %d ok, %d failed, %d rate limited; log: %d events in %d pages (meta.total %d), %d duplicates, %d acknowledged missing, %d of the failed calls present, %d phantoms; all acknowledged events in the log %v after the last restart",
		len(calls), len(acked), failed, rateLimited, len(lc.byID), lc.pages, lc.total, len(lc.duplicates),
		missing, unacked, phantoms, caughtUp.Round(time.Millisecond))
	t.Logf("after the last restart: the relay published %v outbox rows left unsent by the kill; the event log writer stored %v events (re-deliveries of uncommitted offsets included)",
		n.metric(t, "carehub_outbox_published_total"), n.metric(t, "carehub_eventlog_events_written_total"))
	if len(lc.duplicates) > 0 {
		t.Errorf("%d events served more than once: %v", len(lc.duplicates), lc.duplicates[:min(len(lc.duplicates), 10)])
	}
	if lc.total != int64(len(lc.byID)) {
		t.Errorf("meta.total %d, but %d distinct events were served", lc.total, len(lc.byID))
	}
	if missing > 0 {
		t.Errorf("%d acknowledged events lost", missing)
	}
	n.terminate(t)
}

// node is a running `carehub serve`.
type node struct {
	cmd    *exec.Cmd
	addr   string
	stderr *bytes.Buffer
	done   chan struct{} // closed when the process has exited
}

func (n *node) url() string { return "http://" + n.addr }

// buildCarehub builds cmd/carehub into the test's temp dir.
func buildCarehub(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "carehub")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "carehub/cmd/carehub").CombinedOutput(); err != nil {
		t.Fatalf("build carehub: %v\n%s", err, out)
	}
	return bin
}

// startNode starts `carehub serve` on dir and waits until /readyz answers 200. When the test
// ends, a node still running is stopped with SIGTERM, which also stops its Postgres cluster.
func startNode(t *testing.T, bin, dir, addr string) *node {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--data-dir", dir, "--http-addr", addr, "--partitions", "3", "--log-level", "warn")
	n := &node{cmd: cmd, addr: addr, stderr: &bytes.Buffer{}, done: make(chan struct{})}
	cmd.Stderr = &syncWriter{w: n.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(n.done) }()
	t.Cleanup(func() {
		select {
		case <-n.done:
			return
		default:
		}
		n.terminate(t)
	})
	hc := &http.Client{Timeout: 5 * time.Second}
	for deadline := time.Now().Add(2 * time.Minute); ; {
		resp, err := hc.Get(n.url() + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return n
			}
		}
		select {
		case <-n.done:
			t.Fatalf("carehub serve exited before it was ready:\n%s", n.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("carehub not ready after 2 min:\n%s", n.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (n *node) kill(t *testing.T) {
	t.Helper()
	if err := n.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL: %v", err)
	}
	<-n.done
}

// terminate stops the node with SIGTERM, killing it after a minute.
func (n *node) terminate(t *testing.T) {
	t.Helper()
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
		if code := n.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("carehub exited with %d after SIGTERM:\n%s", code, n.stderr)
		}
	case <-time.After(time.Minute):
		_ = n.cmd.Process.Kill()
		<-n.done
		t.Errorf("carehub did not stop within a minute of SIGTERM")
	}
}

func (n *node) metric(t *testing.T, name string) float64 { return metric(t, n.url(), name) }

// createKey makes a live key of the demo organization with the CLI, as an operator would.
func createKey(t *testing.T, bin, dir string, scopes ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := []string{"keys", "create", "--data-dir", dir, "--org", demo.DemoOrgSlug, "--mode", access.Live,
		"--scopes", strings.Join(scopes, ","), "--json"}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("carehub keys create: %v\n%s", err, stderr.String())
	}
	var k struct{ Key string }
	if err := json.Unmarshal(out, &k); err != nil || k.Key == "" {
		t.Fatalf("carehub keys create --json: %q (%v)", out, err)
	}
	return k.Key
}

func freeAddr(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", freePort(t))
}

// syncWriter serializes writes: exec copies stderr from its own goroutine while the test may
// read the buffer.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
