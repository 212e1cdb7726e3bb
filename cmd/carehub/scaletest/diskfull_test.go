package scaletest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/e2e/servertest"
	"carehub/internal/testenv"
	"carehub/storage/demo"
	"carehub/storage/postgres"
)

// diskSize is the tmpfs the node's data dir lives on: a fresh data dir with the demo data takes
// about 135 MB (Postgres 134 MB, 64 MB of it preallocated WAL; the broker's segments kilobytes),
// and a minute of the test's load some megabytes more.
const diskSize = "256m"

// fullFor is how long the disk stays full under load.
const fullFor = 20 * time.Second

// TestFaultDiskFull fills the disk of the embedded defaults (the managed Postgres and the
// in-process broker on one small tmpfs) under a steady load of published events, arrays of
// events and observations, keeps it full for fullFor (during which the embedded Postgres needs a
// WAL segment, PANICs and shuts down: walPanic), then frees it, and counts: every write refused
// meanwhile is a 503 UNAVAILABLE saying that storage is full (never a 500 or a hang), /readyz
// says so, the node does not exit, writes are accepted again without a restart once space
// returns, and every acknowledged event and observation is stored once.
func TestFaultDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root to mount a tmpfs as the full disk (CI runs as root)")
	}
	if _, err := postgres.FindBinaries(); err != nil {
		testenv.Missing(t, "needs the embedded Postgres: %v", err)
	}
	mnt := mountTmpfs(t, diskSize)
	bin := binary
	if bin == "" { // TestMain builds it only for the real-engine tests
		var remove func()
		bin, remove = testenv.BuildCarehub()
		t.Cleanup(remove)
	}

	dataDir := filepath.Join(mnt, "data")
	n := serveOn(t, bin, dataDir)
	key := n.demoKey(t)
	if fi, err := os.Lstat(filepath.Join(dataDir, "postgres", "data")); err != nil || !fi.IsDir() {
		t.Fatalf("the embedded Postgres is not on the test's disk (%v, %v): user postgres cannot reach %s", fi, err, dataDir)
	}

	ctx := context.Background()
	dsn := fmt.Sprintf("host=%s user=carehub dbname=carehub sslmode=disable", filepath.Join(dataDir, "postgres", "run"))
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	var project, devices string
	if err := db.QueryRow(ctx, `select id from projects where org_id = $1 and name = $2`, demo.DemoOrgID, demo.SepsisProjectName).Scan(&project); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(ctx, `select id from projects where org_id = $1 order by created_at, id limit 1`, demo.DemoOrgID).Scan(&devices); err != nil {
		t.Fatal(err)
	}
	// A table whose updates write WAL without growing (room on each page), for walPanic.
	if _, err := db.Exec(ctx, `create table diskfull_wal (id int primary key, v int) with (fillfactor = 50);
		insert into diskfull_wal select g, 0 from generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	_ = db.Close(ctx)

	l := &load{t: t, key: key, api: n.addr, ingest: n.addr, project: project, failures: map[string]int{}}
	stop := l.run(3, 1)
	l.waitAcked(300, 2*time.Minute)
	before := l.counts()
	p := &probe{l: l, n: n}

	// Full: a filler takes every free byte, and takes again what the stores free meanwhile.
	filler := fillDisk(t, mnt)
	full := time.Now()
	var refusals, answersDuringFull []answer
	var readyz []string
	panicked := false
	for time.Since(full) < fullFor {
		if !panicked && time.Since(full) > fullFor/4 {
			panicked = walPanic(t, dsn)
		}
		n.alive(t)
		filler.topUp()
		for _, a := range p.writes() {
			answersDuringFull = append(answersDuringFull, a)
			if !a.ok() {
				refusals = append(refusals, a)
			}
		}
		readyz = append(readyz, n.readyz())
		time.Sleep(500 * time.Millisecond)
	}
	duringFull := l.counts()
	failuresFull := l.failureCounts()

	// Space returns: writes are accepted again without a restart.
	filler.remove()
	freed := time.Now()
	servertest.Eventually(t, 2*time.Minute, "writes accepted again after space returned", func() bool {
		n.alive(t)
		for _, a := range p.writes() {
			if !a.ok() {
				return false
			}
		}
		return true
	})
	recovered := time.Since(freed)
	servertest.Eventually(t, time.Minute, "/readyz ready again", func() bool { return n.readyz() == "200" })
	l.waitAcked(l.counts().events+l.counts().observations+200, 2*time.Minute)
	stop()
	acked := l.counts()

	// What the node answered while the disk was full.
	refusedFull := 0
	wrong := map[string]int{}
	for _, a := range refusals {
		refusedFull++
		if !a.clearRefusal() {
			wrong[a.String()]++
		}
	}
	for status, c := range failuresFull {
		if !strings.HasPrefix(status, "503") {
			wrong["load: "+status] += c
		}
	}
	if refusedFull == 0 {
		t.Errorf("no write was refused in %s of a full disk (%d answers): the test did not fill it", fullFor, len(answersDuringFull))
	}
	for what, c := range wrong {
		t.Errorf("while the disk was full, %d× %s; want 503 UNAVAILABLE saying storage is full", c, what)
	}
	if !panicked {
		t.Error("the embedded Postgres did not PANIC for want of a WAL segment: the test did not prove it comes back")
	}
	if !slices.ContainsFunc(readyz, func(s string) bool { return s != "200" && diskWords.MatchString(s) }) {
		t.Errorf("/readyz while the disk was full never said it was not ready because of the disk: %q", slices.Compact(readyz))
	}

	// Every acknowledged event is in the log once.
	var logged []string
	servertest.Eventually(t, 3*time.Minute, "every acknowledged event in the event log", func() bool {
		var err error
		logged, err = n.eventIDs(key, project, "integration.heartbeat", time.Time{})
		return err == nil && l.missing(logged, l.eventIDs()) == 0
	})
	dupEvents := duplicates(logged)
	if len(dupEvents) > 0 {
		t.Errorf("events served more than once: %v", dupEvents)
	}
	// Every acknowledged observation is stored, with one device event.
	if db, err = pgx.Connect(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(context.Background()) })
	obsIDs := l.observationIDs()
	var storedObs int
	servertest.Eventually(t, 3*time.Minute, "every acknowledged observation stored", func() bool {
		err := db.QueryRow(ctx, `select count(*) from observations where id = any($1)`, obsIDs).Scan(&storedObs)
		return err == nil && storedObs == len(obsIDs)
	})
	var obsEvents map[string]int
	servertest.Eventually(t, 3*time.Minute, "a device event of every acknowledged observation", func() bool {
		var err error
		if obsEvents, err = n.observationEvents(key, devices, time.Time{}); err != nil {
			return false
		}
		return !slices.ContainsFunc(obsIDs, func(id string) bool { return obsEvents[id] == 0 })
	})
	dupObs := 0
	for _, id := range obsIDs {
		if obsEvents[id] > 1 {
			dupObs++
			t.Errorf("observation %s: %d device events, want 1", id, obsEvents[id])
		}
	}
	n.alive(t)

	t.Logf("disk full for %s, the embedded Postgres shut down by a PANIC (no room for a WAL segment) %s into it: %d events and %d observations acknowledged before, %d and %d while full; %d probe writes refused, e.g. %s",
		fullFor, fullFor/4, before.events, before.observations, duringFull.events-before.events, duringFull.observations-before.observations,
		refusedFull, firstOr(refusals))
	t.Logf("load refused while full: %v; /readyz: %q", failuresFull, slices.Compact(readyz))
	t.Logf("acknowledged: %d events, %d observations; refused in all: %v", acked.events, acked.observations, l.failureCounts())
	t.Logf("stored: %d of %d events in the log, %d of %d observations in Postgres, each with its device event",
		len(logged)-len(dupEvents), acked.events, storedObs, len(obsIDs))
	t.Logf("lost: %d; duplicated: %d events, %d observations' device events; time to recover: %v after space returned, without a restart",
		l.missing(logged, l.eventIDs())+len(obsIDs)-storedObs, len(dupEvents), dupObs, recovered.Round(100*time.Millisecond))
}

// walPanic has the embedded Postgres need a WAL segment on the full disk, as a write-heavy
// load in time does: it PANICs, fails its crash recovery for want of space and shuts down.
// It reports whether the server went away.
func walPanic(t *testing.T, dsn string) bool {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Logf("walPanic: %v", err)
		return false
	}
	defer func() { _ = conn.Close(ctx) }()
	for range 20000 {
		if _, err := conn.Exec(ctx, `update diskfull_wal set v = v + 1 where id % 20 = 0`); err != nil {
			t.Logf("walPanic: %v", err)
			return conn.IsClosed() // a PANIC ends every session
		}
	}
	return false
}

// diskWords is how a clear refusal names the cause. Three answers name the store that is down
// instead, and /readyz says why: an observation the broker took just before the disk filled,
// whose audit record it then refused, is withheld as patient data whose access is not
// recorded; while the embedded Postgres is down (walPanic) API keys cannot be checked; and a
// write whose connection the PANIC broke says the database is unavailable.
var diskWords = regexp.MustCompile(`(?i)disk|full|audit log is temporarily unavailable|authentication is temporarily unavailable|the database \(Postgres\) is unavailable`)

// mountTmpfs mounts a tmpfs of size on a new directory user postgres can traverse (the
// embedded Postgres runs as postgres, and would otherwise be placed in its home, off this
// disk), and unmounts it when the test ends, lazily when something still holds it.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "carehub-diskfull-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0755", "tmpfs", dir).CombinedOutput(); err != nil {
		_ = os.Remove(dir)
		testenv.Missing(t, "cannot mount a tmpfs as the full disk: %v: %s", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v: %s; unmounting lazily", dir, err, bytes.TrimSpace(out))
			_ = exec.Command("umount", "-l", dir).Run()
		}
		_ = os.Remove(dir)
	})
	return dir
}

// serveOn runs `carehub serve --demo-key` on dataDir and a free loopback port, and waits until
// /readyz answers 200. When the test ends the node is stopped with SIGTERM, and a postmaster
// it leaves behind (the embedded Postgres is detached from carehub) is shut down too, so the
// disk can be unmounted.
func serveOn(t *testing.T, bin, dataDir string) *node {
	t.Helper()
	addr := testenv.FreeAddr(t)
	cmd := exec.Command(bin, "serve", "--http-addr", addr, "--data-dir", dataDir, "--demo-key", "--log-format", "text", "--log-level", "warn")
	return launch(t, "diskfull", addr, cmd, func() {
		stopPostmaster(t, filepath.Join(dataDir, "postgres", "data"))
		if b, err := os.ReadFile(filepath.Join(dataDir, "postgres", "postgres.log")); err == nil && t.Failed() {
			t.Logf("postgres.log:\n%s", tail(string(b), 60))
		}
	})
}

// stopPostmaster shuts down (immediate mode) a postmaster still running on pgdata.
func stopPostmaster(t *testing.T, pgdata string) {
	b, err := os.ReadFile(filepath.Join(pgdata, "postmaster.pid"))
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil || syscall.Kill(pid, syscall.SIGQUIT) != nil {
		return
	}
	t.Logf("carehub left its postmaster %d running; shut it down", pid)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && syscall.Kill(pid, 0) == nil; {
		time.Sleep(50 * time.Millisecond)
	}
}

func tail(s string, lines int) string {
	all := strings.Split(s, "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

// alive fails the test if the node has exited.
func (n *node) alive(t *testing.T) {
	t.Helper()
	select {
	case <-n.exited:
		t.Fatalf("carehub exited: %v\n%s", n.cmd.ProcessState, n.output())
	default:
	}
}

// filler holds a file that takes every free byte of a disk.
type filler struct {
	t    *testing.T
	path string
	f    *os.File
}

// fillDisk writes a file in dir until the disk is full.
func fillDisk(t *testing.T, dir string) *filler {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	fl := &filler{t: t, path: path, f: f}
	t.Cleanup(fl.remove)
	fl.topUp()
	return fl
}

// topUp writes until ENOSPC: the disk is full again even if a store freed something.
func (fl *filler) topUp() {
	if fl.f == nil {
		return
	}
	for _, chunk := range []int{1 << 20, 4096, 1} {
		buf := make([]byte, chunk)
		for {
			if _, err := fl.f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					fl.t.Fatalf("fill the disk: %v", err)
				}
				break
			}
		}
	}
}

// remove deletes the filler: the space returns. It is idempotent.
func (fl *filler) remove() {
	if fl.f == nil {
		return
	}
	_ = fl.f.Close()
	fl.f = nil
	if err := os.Remove(fl.path); err != nil {
		fl.t.Errorf("remove the filler: %v", err)
	}
}

// probe makes one write of each kind and keeps what each answered; what was acknowledged is
// added to the load's, so it is checked as stored like the rest.
type probe struct {
	l *load
	n *node

	mu  sync.Mutex
	seq int
}

// answer is what one write was answered.
type answer struct {
	what    string // the call
	status  int    // 0: no answer
	code    string // of the error envelope
	message string // of the error envelope, or the transport error
}

func (a answer) ok() bool { return a.status/100 == 2 }

// clearRefusal is a 503 UNAVAILABLE in the envelope whose message names the full disk.
func (a answer) clearRefusal() bool {
	return a.status == http.StatusServiceUnavailable && a.code == "UNAVAILABLE" && diskWords.MatchString(a.message)
}

func (a answer) String() string {
	return fmt.Sprintf("%s: %d %s %q", a.what, a.status, a.code, a.message)
}

func firstOr(as []answer) string {
	if len(as) == 0 {
		return "none"
	}
	return as[0].String()
}

// writes publishes one event (through the outbox), one array (a Kafka transaction) and ingests
// one observation.
func (p *probe) writes() []answer {
	p.mu.Lock()
	p.seq++
	seq := p.seq
	p.mu.Unlock()
	event := func(seq int) map[string]any {
		return map[string]any{"projectId": p.l.project, "type": "integration.heartbeat", "payload": map[string]any{"worker": -1, "seq": seq}}
	}
	var one struct{ Data []struct{ ID string } }
	a1 := p.post("POST /v1/events (one)", "/v1/events", event(2*seq), &one)
	var arr struct{ Data []struct{ ID string } }
	a2 := p.post("POST /v1/events (array)", "/v1/events", []any{event(2*seq + 1), event(2*seq + 1)}, &arr)
	var obs struct{ IDs []string }
	a3 := p.post("POST /v1/observations", "/v1/observations", map[string]any{
		"resourceType":      "Observation",
		"status":            "final",
		"code":              map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "8867-4"}}},
		"subject":           map[string]any{"reference": "Patient/" + demo.StablePatientID},
		"effectiveDateTime": time.Now().UTC().Format(time.RFC3339),
		"valueQuantity":     map[string]any{"value": 72, "unit": "/min"},
	}, &obs)
	p.l.mu.Lock()
	defer p.l.mu.Unlock()
	for _, r := range []struct {
		a   answer
		ids []string
	}{{a1, idsOf(one.Data)}, {a2, idsOf(arr.Data)}} {
		if r.a.ok() {
			p.l.events = append(p.l.events, r.ids...)
		}
	}
	if a3.ok() {
		p.l.obs = append(p.l.obs, obs.IDs...)
	}
	return []answer{a1, a2, a3}
}

func idsOf(data []struct{ ID string }) []string {
	ids := make([]string, len(data))
	for i, d := range data {
		ids[i] = d.ID
	}
	return ids
}

// post POSTs body to path under a bound a hang would pass, and decodes a 2xx answer into out.
func (p *probe) post(what, path string, body, out any) answer {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, "http://"+p.n.addr+path, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+p.l.key)
	req.Header.Set("Content-Type", "application/json")
	c := http.Client{Timeout: 45 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return answer{what: what, message: err.Error()}
	}
	defer func() { _ = resp.Body.Close() }()
	a := answer{what: what, status: resp.StatusCode}
	raw, _ := io.ReadAll(resp.Body)
	if a.ok() {
		if err := json.Unmarshal(raw, out); err != nil {
			return answer{what: what, status: resp.StatusCode, message: "undecodable: " + err.Error()}
		}
		return a
	}
	var env struct {
		Error struct{ Code, Message string }
	}
	if json.Unmarshal(raw, &env) != nil {
		a.message = string(raw)
	}
	a.code, a.message = env.Error.Code, cmp.Or(a.message, env.Error.Message)
	return a
}
