package scaletest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/e2e/servertest"
	"carehub/storage/postgres"
)

// failoverAfter is how long the primary is gone before the standby is promoted: what a failover
// manager takes to decide the primary is dead, shortened. Meanwhile no server takes writes.
const failoverAfter = 10 * time.Second

// failoverRecoverBound is how soon after the promotion events and observations must be
// acknowledged again: the bound for a broker kill.
const failoverRecoverBound = 30 * time.Second

// TestFaultPostgresFailover runs api, ingest and processors processes on a three-broker Kafka
// cluster and a Postgres primary with a synchronous streaming standby, all three on one DSN
// naming both servers with target_session_attrs=read-write, under the load of TestFaults. It
// SIGKILLs the primary's postmaster, promotes the standby failoverAfter later, and checks: while
// no server takes writes, calls are acknowledged or answered 503 naming postgres, never 500;
// after the promotion calls are acknowledged again within failoverRecoverBound; everything
// acknowledged before, during and after is stored once, delivered to the webhook and pushed to
// the subscriber.
//
// The event log stays in Postgres (no ClickHouse): it is then on the store that fails over, so
// the log's exactly-once is proven across the promotion too, and the machine runs one engine
// fewer.
func TestFaultPostgresFailover(t *testing.T) {
	if !faultsOn() {
		t.Skip("the fault suite kills engines: make test-faults (" + EnvFaults + "=1)")
	}
	root := checkoutRoot(t)
	kc := startCluster(t, root)
	pair := startReplicated(t)
	dsn := pair.dsn()

	api, l, v := startRoles(t, dsn, clusterFlags(t, dsn, kc.brokers))

	began := time.Now()
	pair.primary.kill(t)
	// Calls while no server takes writes: the pool's connections broke with the primary, and
	// the standby refuses them as read-only.
	var answers []failoverAnswer
	for time.Since(began) < failoverAfter-2*time.Second {
		time.Sleep(3 * time.Second)
		answers = append(answers, l.failoverProbe(api.addr)...)
	}
	time.Sleep(failoverAfter - time.Since(began))
	promoting := time.Now()
	pair.promote(t)
	promoted := time.Now()

	var eventsBack, obsBack time.Time
	servertest.Eventually(t, 2*time.Minute, "events and observations acknowledged after the promotion", func() bool {
		eventsBack, obsBack = l.firstAcked(true, promoting), l.firstAcked(false, promoting)
		return !eventsBack.IsZero() && !obsBack.IsZero()
	})
	back := max(eventsBack.Sub(promoting), obsBack.Sub(promoting))
	if back > failoverRecoverBound {
		t.Errorf("calls acknowledged again %v after the promotion began, want within %v", back.Round(time.Second), failoverRecoverBound)
	}
	caughtUp := v.caughtUp(t, promoted)
	// The load runs on for 20 s after the promotion, as TestFaults' faults do.
	time.Sleep(20*time.Second - time.Since(promoted))

	for _, a := range answers {
		if !a.ok() && (a.status != http.StatusServiceUnavailable || a.code != "UNAVAILABLE" || a.dependency != postgres.Dependency) {
			t.Errorf("%s with no writable Postgres: %s; want it acknowledged or 503 UNAVAILABLE naming %s", a.what, a, postgres.Dependency)
		}
	}
	for why, n := range l.failureCounts() {
		if (strings.HasPrefix(why, "5") && why != "503 Service Unavailable") || why == "no answer" {
			t.Errorf("%d calls of the load answered %q during the failover; want 503 or acknowledged", n, why)
		}
	}
	t.Logf("fault postgres-failover: primary killed, standby promoted %v later (pg_ctl promote took %v); calls meanwhile: %v",
		promoting.Sub(began).Round(100*time.Millisecond), promoted.Sub(promoting).Round(100*time.Millisecond), answers)
	t.Logf("fault postgres-failover: after the promotion began the first acknowledged event came %v later, observation %v; acknowledged again %v after the kill",
		eventsBack.Sub(promoting).Round(100*time.Millisecond), obsBack.Sub(promoting).Round(100*time.Millisecond), (back + promoting.Sub(began)).Round(100*time.Millisecond))
	v.report(t, "postgres-failover", began, promoted, caughtUp)
}

// firstAcked is when the first event (or observation) acknowledged at or after from was; zero
// when there is none yet.
func (l *load) firstAcked(events bool, from time.Time) time.Time {
	ids := l.ackedIn(events, from, time.Now().Add(time.Minute))
	l.mu.Lock()
	defer l.mu.Unlock()
	var first time.Time
	for _, id := range ids {
		if at := l.ackedAt[id]; first.IsZero() || at.Before(first) {
			first = at
		}
	}
	return first
}

// failoverAnswer is how one call made with no writable Postgres was answered.
type failoverAnswer struct {
	what       string
	status     int    // 0: no answer
	code       string // the error envelope's or the GraphQL error's code
	dependency string // the dependency the error names
}

func (a failoverAnswer) ok() bool { return a.status/100 == 2 && a.code == "" }

func (a failoverAnswer) String() string {
	if a.ok() {
		return a.what + " acknowledged"
	}
	return fmt.Sprintf("%s %d %s %s", a.what, a.status, a.code, a.dependency)
}

// failoverProbe makes one call of each kind the load makes, and a read of the event log, and
// counts what is acknowledged as the load's, so the verifier looks for it.
func (l *load) failoverProbe(api string) []failoverAnswer {
	const worker = 200 // marks the probes' payloads apart from the load's workers'
	var answers []failoverAnswer

	var pub struct {
		Data struct{ PublishEvent struct{ ID string } }
	}
	a := l.failoverCall("publishEvent", http.MethodPost, "http://"+api+"/graphql", map[string]any{
		"query":     `mutation($p: ID!, $pl: JSON!) { publishEvent(type: "integration.heartbeat", payload: $pl, projectId: $p) { id } }`,
		"variables": map[string]any{"p": l.project, "pl": map[string]any{"worker": worker, "seq": 0}},
	}, &pub)
	if a.ok() && pub.Data.PublishEvent.ID != "" {
		l.acked([]string{pub.Data.PublishEvent.ID}, true, false)
	}
	answers = append(answers, a)

	drafts := make([]map[string]any, arrayLen)
	for j := range drafts {
		drafts[j] = map[string]any{"projectId": l.project, "type": "integration.heartbeat",
			"payload": map[string]any{"worker": worker, "seq": j}}
	}
	var arr struct{ Data []struct{ ID string } }
	a = l.failoverCall("array of events", http.MethodPost, "http://"+api+"/v1/events", drafts, &arr)
	if a.ok() {
		ids := make([]string, 0, len(arr.Data))
		for _, ev := range arr.Data {
			ids = append(ids, ev.ID)
		}
		l.acked(ids, true, true)
	}
	answers = append(answers, a)

	var obs struct{ IDs []string }
	a = l.failoverCall("observation", http.MethodPost, "http://"+l.ingest+"/v1/observations", heartRate(), &obs)
	if a.ok() {
		l.acked(obs.IDs, false, false)
	}
	answers = append(answers, a)

	var page json.RawMessage
	return append(answers, l.failoverCall("GET /v1/events", http.MethodGet, "http://"+api+"/v1/events?limit=1&projectId="+l.project, nil, &page))
}

// failoverCall makes one call as the load does and decodes a 2xx answer into out.
func (l *load) failoverCall(what, method, u string, body, out any) failoverAnswer {
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, _ := http.NewRequest(method, u, rd)
	req.Header.Set("Authorization", "Bearer "+l.key)
	req.Header.Set("Content-Type", "application/json")
	c := http.Client{Timeout: time.Minute}
	a := failoverAnswer{what: what}
	resp, err := c.Do(req)
	if err != nil {
		a.code = err.Error()
		return a
	}
	defer func() { _ = resp.Body.Close() }()
	var raw bytes.Buffer
	_, _ = raw.ReadFrom(resp.Body)
	a.status = resp.StatusCode
	var e struct {
		Error struct {
			Code    string
			Details struct{ Dependency string }
		}
		Errors []struct {
			Extensions struct{ Code, Dependency string }
		}
	}
	_ = json.Unmarshal(raw.Bytes(), &e)
	a.code, a.dependency = e.Error.Code, e.Error.Details.Dependency
	if len(e.Errors) > 0 {
		a.code, a.dependency = e.Errors[0].Extensions.Code, e.Errors[0].Extensions.Dependency
	}
	if a.ok() {
		_ = json.Unmarshal(raw.Bytes(), out)
	}
	return a
}

// replicated is a Postgres primary and its synchronous streaming standby, each on its own data
// dir and unix socket.
//
// Both postmasters are the test's own children, not postgres.Local's: Local supervises its
// server and starts it again when it stops by itself, and a killed primary started again beside
// the promoted standby would be a second server taking writes (what a failover manager fences
// off). Local still makes the primary's cluster (initdb, carehub's settings, the database), and
// is stopped before the test's postmaster takes it over.
type replicated struct {
	dir              string
	bin              string
	cred             *syscall.Credential // the server's user when the test runs as root
	primary, standby *pgProc
}

// pgProc is one postmaster.
type pgProc struct {
	r          *replicated
	name       string
	data, sock string
	proc       *os.Process
	exited     chan struct{}
}

// standbySlot is the primary's replication slot for the standby: it keeps the WAL the standby
// has not received yet.
const standbySlot = "carehub_standby"

// startReplicated makes the primary, a base backup of it as the standby, starts both, and then
// makes the standby synchronous (synchronous_standby_names '*', synchronous_commit on): a commit
// the primary acknowledges is flushed on the standby too, so promoting it loses no acknowledged
// write. Set before the base backup, the standby would inherit it and, once promoted with no
// standby of its own, wait for ever on every commit.
func startReplicated(t *testing.T) *replicated {
	t.Helper()
	dir := postgresDir(t, "carehub-failover-pg-")
	r := &replicated{dir: dir}
	t.Cleanup(func() {
		for _, p := range []*pgProc{r.standby, r.primary} {
			if p != nil {
				p.stop()
			}
		}
		_ = os.RemoveAll(dir)
	})
	var err error
	if r.bin, err = postgres.FindBinaries(); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("PostgreSQL refuses root and there is no user postgres: %v", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		r.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	local, err := postgres.StartLocal(ctx, filepath.Join(dir, "primary"), postgres.LocalConfig{Attached: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := local.EnsureDatabase(ctx, "carehub"); err != nil {
		t.Fatal(err)
	}
	r.primary = &pgProc{r: r, name: "primary", data: local.DataDir(), sock: local.SocketDir()}
	if err := local.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	r.primary.start(t)

	standbyRoot := filepath.Join(dir, "standby")
	r.mkdirOwned(t, standbyRoot)
	r.mkdirOwned(t, filepath.Join(standbyRoot, "run"))
	r.standby = &pgProc{r: r, name: "standby", data: filepath.Join(standbyRoot, "data"), sock: filepath.Join(standbyRoot, "run")}
	// -R writes the standby's primary_conninfo and standby.signal; -C -S the slot.
	r.run(t, standbyRoot, "pg_basebackup", "-h", r.primary.sock, "-p", "5432", "-U", "carehub", "-D", r.standby.data,
		"-R", "-X", "stream", "-c", "fast", "-C", "-S", standbySlot)
	r.standby.start(t)

	conn, err := pgx.Connect(ctx, r.primary.dsnOf("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	r.waitReplication(t, conn, "streaming")
	for _, sql := range []string{`alter system set synchronous_standby_names = '*'`, `alter system set synchronous_commit = on`, `select pg_reload_conf()`} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	r.waitReplication(t, conn, "sync")
	t.Logf("postgres primary %s with a synchronous standby %s", r.primary.data, r.standby.data)
	return r
}

// dsn names both servers, the primary first; target_session_attrs=read-write has the client
// skip the one that is a standby (or gone) and use the other.
func (r *replicated) dsn() string {
	return fmt.Sprintf("host=%s,%s port=5432 user=carehub dbname=carehub sslmode=disable target_session_attrs=read-write",
		r.primary.sock, r.standby.sock)
}

// waitReplication waits until the primary has a standby whose state (pg_stat_replication's
// state, or its sync_state when want is "sync") is want.
func (r *replicated) waitReplication(t *testing.T, conn *pgx.Conn, want string) {
	t.Helper()
	col := "state"
	if want == "sync" {
		col = "sync_state"
	}
	servertest.Eventually(t, time.Minute, "the standby "+want, func() bool {
		var n int
		err := conn.QueryRow(context.Background(), `select count(*) from pg_stat_replication where `+col+` = $1`, want).Scan(&n)
		return err == nil && n == 1
	})
}

// promote makes the standby a primary and waits until it takes writes.
func (r *replicated) promote(t *testing.T) {
	t.Helper()
	r.run(t, filepath.Dir(r.standby.data), "pg_ctl", "promote", "-D", r.standby.data, "-w", "-t", "60")
	t.Logf("standby promoted")
}

// run runs a PostgreSQL program as the server's user in dir (the programs fail when they cannot
// resolve their working directory), without the caller's PG* environment.
func (r *replicated) run(t *testing.T, dir, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(r.bin, name), args...)
	cmd.Dir, cmd.Env = dir, serverEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: r.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func (r *replicated) mkdirOwned(t *testing.T, dir string) {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if r.cred != nil {
		if err := os.Chown(dir, int(r.cred.Uid), int(r.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
}

// serverEnv is the environment without PG*: the caller's PGHOST or PGDATA must not steer them.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return env
}

// start runs the postmaster on its data dir and socket dir and waits until it accepts
// connections (a standby's read-only ones).
func (p *pgProc) start(t *testing.T) {
	t.Helper()
	logPath := filepath.Join(p.r.dir, p.name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(p.r.bin, "postgres"), "-D", p.data, "-k", p.sock)
	cmd.Dir, cmd.Env = filepath.Dir(p.data), serverEnv()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// SIGQUIT (immediate shutdown) when the test binary dies, so a timed-out run leaves no server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.r.cred, Setpgid: true, Pdeathsig: syscall.SIGQUIT}
	started := make(chan error, 1)
	p.exited = make(chan struct{})
	go func() {
		defer close(p.exited)
		defer func() { _ = logFile.Close() }()
		// The parent-death signal follows the thread that forked the child (golang/go#27505).
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	p.proc = cmd.Process
	servertest.Eventually(t, 2*time.Minute, p.name+" accepting connections", func() bool {
		select {
		case <-p.exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("%s exited:\n%s", p.name, b)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, p.dsnOf("postgres"))
		if err != nil {
			return false
		}
		_ = conn.Close(ctx)
		return true
	})
}

func (p *pgProc) dsnOf(database string) string {
	return fmt.Sprintf("host=%s port=5432 user=carehub dbname=%s sslmode=disable", p.sock, database)
}

// kill SIGKILLs the postmaster, as a lost machine or the OOM killer would; its backends exit
// when they notice, without answering what they were committing.
func (p *pgProc) kill(t *testing.T) {
	t.Helper()
	if err := p.proc.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.exited
	t.Logf("postgres %s killed (SIGKILL to postmaster %d)", p.name, p.proc.Pid)
}

// stop shuts the postmaster down (fast) if it runs, immediately if that takes too long.
func (p *pgProc) stop() {
	if p.proc == nil {
		return
	}
	_ = p.proc.Signal(syscall.SIGINT)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.proc.Signal(syscall.SIGQUIT)
		<-p.exited
	}
}
