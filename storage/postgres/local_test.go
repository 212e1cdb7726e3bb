package postgres_test

import (
	"bufio"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/internal/testenv"
	"carehub/storage/postgres"
)

func TestFindBinaries(t *testing.T) {
	dir, err := postgres.FindBinaries()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("FindBinaries() = %s, which lacks %s: %v", dir, name, err)
		}
	}
}

func TestLocalLifecycle(t *testing.T) {
	dir := testenv.ClusterDir(t)
	l, first := startLocal(t, dir, postgres.LocalConfig{})
	t.Logf("first start (initdb + start): %v", first)

	conn := connect(t, l.DSN("postgres"))
	for setting, want := range map[string]string{
		"listen_addresses":   "",
		"max_connections":    "200",
		"wal_buffers":        "16MB",
		"max_wal_size":       "2GB",
		"fsync":              "on",
		"synchronous_commit": "on",
		"server_encoding":    "UTF8",
		"TimeZone":           "UTC",
	} {
		var got string
		if err := conn.QueryRow(context.Background(), "SELECT current_setting($1)", setting).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %q, want %q", setting, got, want)
		}
	}
	var buffersMB uint64
	if err := conn.QueryRow(context.Background(), `select setting::bigint * 8192 / 1048576 from pg_settings where name = 'shared_buffers'`).Scan(&buffersMB); err != nil {
		t.Fatal(err)
	}
	if want := postgres.SharedBuffersMB(); buffersMB != want || want < 128 || want > 1024 {
		t.Errorf("shared_buffers = %d MB, want %d (an eighth of the memory, 128 MB to 1 GB)", buffersMB, want)
	}
	if _, err := os.Stat("/proc/self/stat"); err == nil {
		if cpu, err := l.CPUTime(); err != nil || cpu <= 0 {
			t.Errorf("CPU time of a cluster that has served queries: %v, %v", cpu, err)
		}
	}
	if fi, err := os.Stat(l.SocketDir()); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("socket dir %s: %v, mode %v; want 0700", l.SocketDir(), err, fi.Mode())
	}
	if !strings.HasPrefix(l.SocketDir(), dir) || !strings.HasPrefix(l.DataDir(), dir) {
		t.Errorf("cluster outside its dir %s: data %s, socket %s", dir, l.DataDir(), l.SocketDir())
	}

	ctx := context.Background()
	for range 2 { // idempotent
		if err := l.EnsureDatabase(ctx, "app"); err != nil {
			t.Fatal(err)
		}
	}
	app := connect(t, l.DSN("app"))
	if _, err := app.Exec(ctx, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before restart')"); err != nil {
		t.Fatal(err)
	}

	stop(t, l)
	stop(t, l) // idempotent
	if _, err := pgx.Connect(ctx, l.DSN("app")); err == nil {
		t.Fatal("connected to a stopped server")
	}

	l2, restart := startLocal(t, dir, postgres.LocalConfig{})
	t.Logf("restart of the existing cluster: %v", restart)
	if got := scalar(t, l2.DSN("app"), "SELECT v FROM kept"); got != "before restart" {
		t.Errorf("after restart: %q", got)
	}
	stop(t, l2)
}

// A carehub that was SIGKILLed leaves its (detached) server running; the next start adopts it
// rather than restarting it.
func TestLocalAdoptsRunningServer(t *testing.T) {
	dir := testenv.ClusterDir(t)
	first, _ := startLocal(t, dir, postgres.LocalConfig{Unsafe: true})
	pid := postmasterPID(t, first)
	conn := connect(t, first.DSN("postgres"))

	second, took := startLocal(t, dir, postgres.LocalConfig{Unsafe: true})
	t.Logf("start adopting a running server: %v", took)
	if got := postmasterPID(t, second); got != pid {
		t.Fatalf("postmaster %d replaced by %d; want it adopted", pid, got)
	}
	if err := conn.Ping(context.Background()); err != nil {
		t.Fatalf("session of the first start broken: %v", err)
	}
	stop(t, second)
	if err := conn.Ping(context.Background()); err == nil {
		t.Fatal("server still serving after Stop")
	}
	stop(t, first) // nothing left to stop
}

// Two carehubs starting on one fresh dir at once: one creates and starts the cluster, the
// other waits and adopts it.
func TestLocalConcurrentStarts(t *testing.T) {
	dir := testenv.ClusterDir(t)
	var (
		wg     sync.WaitGroup
		locals [2]*postgres.Local
		errs   [2]error
	)
	for i := range locals {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			locals[i], errs[i] = postgres.StartLocal(ctx, dir, postgres.LocalConfig{Unsafe: true})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		t.Cleanup(func() { _ = locals[i].Stop(context.Background()) })
	}
	if a, b := postmasterPID(t, locals[0]), postmasterPID(t, locals[1]); a != b {
		t.Fatalf("two servers on one data dir? pids %d and %d", a, b)
	}
	if got := scalar(t, locals[1].DSN("postgres"), "SELECT 'ok'"); got != "ok" {
		t.Fatal(got)
	}
	stop(t, locals[0])
}

func TestLocalCrashRecovery(t *testing.T) {
	dir := testenv.ClusterDir(t)
	l, _ := startLocal(t, dir, postgres.LocalConfig{})
	if _, err := connect(t, l.DSN("postgres")).Exec(context.Background(),
		"CREATE TABLE durable (v int); INSERT INTO durable VALUES (42)"); err != nil {
		t.Fatal(err)
	}

	t.Run("postmaster killed", func(t *testing.T) {
		pid := postmasterPID(t, l)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitGone(t, pid)
		if _, err := os.Stat(filepath.Join(l.DataDir(), "postmaster.pid")); err != nil {
			t.Fatalf("want a stale postmaster.pid to recover from: %v", err)
		}
		l2, took := startLocal(t, dir, postgres.LocalConfig{})
		t.Logf("start after SIGKILL of the postmaster: %v", took)
		if got := scalar(t, l2.DSN("postgres"), "SELECT v::text FROM durable"); got != "42" {
			t.Errorf("committed row after crash: %q", got)
		}
		stop(t, l2)
	})

	t.Run("pid reused by another process", func(t *testing.T) {
		// The pid in a stale postmaster.pid now belongs to some live process: the server's
		// own check (kill(pid, 0)) would take it for a running postmaster and refuse.
		other := exec.Command("sleep", "60")
		if err := other.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
		pidFile := filepath.Join(l.DataDir(), "postmaster.pid")
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(other.Process.Pid)+"\n"+l.DataDir()+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		l3, _ := startLocal(t, dir, postgres.LocalConfig{})
		if got := postmasterPID(t, l3); got == other.Process.Pid {
			t.Fatalf("postmaster.pid still names the unrelated process %d", got)
		}
		if got := scalar(t, l3.DSN("postgres"), "SELECT v::text FROM durable"); got != "42" {
			t.Errorf("row: %q", got)
		}
		stop(t, l3)
	})
}

func TestLocalLongDirUsesShortSocketDir(t *testing.T) {
	dir := filepath.Join(testenv.ClusterDir(t), strings.Repeat("d", 100))
	l, _ := startLocal(t, dir, postgres.LocalConfig{Unsafe: true})
	t.Cleanup(func() { _ = os.RemoveAll(l.SocketDir()) })
	if !strings.HasPrefix(l.DataDir(), dir) {
		t.Fatalf("cluster in %s, not in %s", l.DataDir(), dir)
	}
	if len(l.SocketDir())+len("/.s.PGSQL.5432") > 107 || !strings.HasPrefix(l.SocketDir(), "/tmp/carehub-pg-") {
		t.Fatalf("socket dir %s for a long dir", l.SocketDir())
	}
	if got := scalar(t, l.DSN("postgres"), "SELECT 'ok'"); got != "ok" {
		t.Fatal(got)
	}
	stop(t, l)
	l2, _ := startLocal(t, dir, postgres.LocalConfig{Unsafe: true})
	if l2.SocketDir() != l.SocketDir() {
		t.Errorf("socket dir moved across restarts: %s, then %s", l.SocketDir(), l2.SocketDir())
	}
	stop(t, l2)
}

// As root, with a dir that user postgres cannot traverse, the cluster lives in postgres's
// home and dir/data links to it; deleting dir deletes that cluster.
func TestLocalRelocatesUnreachableDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("relocation happens only when running as root")
	}
	parent := testenv.ClusterDir(t)
	if err := os.Chmod(parent, 0o700); err != nil { // root's, closed to postgres, like /root
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "carehub")
	l, _ := startLocal(t, dir, postgres.LocalConfig{Unsafe: true})
	root := filepath.Dir(l.DataDir())
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	if strings.HasPrefix(l.DataDir(), parent) {
		t.Fatalf("cluster in %s, which postgres cannot reach", l.DataDir())
	}
	if link, err := os.Readlink(filepath.Join(dir, "data")); err != nil || link != l.DataDir() {
		t.Fatalf("%s/data links to %q (%v), want %s", dir, link, err, l.DataDir())
	}
	if _, err := connect(t, l.DSN("postgres")).Exec(context.Background(), "CREATE TABLE marker (v int)"); err != nil {
		t.Fatal(err)
	}
	stop(t, l)

	l2, _ := startLocal(t, dir, postgres.LocalConfig{Unsafe: true})
	if l2.DataDir() != l.DataDir() {
		t.Fatalf("restart moved the cluster: %s, then %s", l.DataDir(), l2.DataDir())
	}
	if got := scalar(t, l2.DSN("postgres"), "SELECT (to_regclass('marker') IS NOT NULL)::text"); got != "true" {
		t.Fatal("table lost across restart")
	}
	// Deleting the data dir while the server runs: the next start removes the old cluster. The
	// process that ran it ends first. Were it still running, its supervisor would start its
	// server again on the cluster the next start removes and makes anew, and the two would
	// fight over it (a stop killed after 30 s failed CI so).
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	stop(t, l2)
	l3, _ := startLocal(t, dir, postgres.LocalConfig{Unsafe: true})
	if got := scalar(t, l3.DSN("postgres"), "SELECT (to_regclass('marker') IS NOT NULL)::text"); got != "false" {
		t.Fatal("deleted data dir, yet the old cluster is back")
	}
	stop(t, l3)
}

// A relocated cluster whose data dir was a temporary one and is gone (a test's, a load test's)
// is removed when another relocated cluster starts: nothing would ever start that data dir
// again to remove it, and each one left its gigabytes in postgres's home.
func TestLocalSweepsClustersOfDeletedTemporaryDirs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("relocation happens only when running as root")
	}
	closed := func() string {
		parent := testenv.ClusterDir(t)
		if err := os.Chmod(parent, 0o700); err != nil { // closed to postgres: relocated
			t.Fatal(err)
		}
		return parent
	}
	gone := filepath.Join(closed(), "carehub")
	l, _ := startLocal(t, gone, postgres.LocalConfig{Unsafe: true})
	orphan := filepath.Dir(l.DataDir())
	t.Cleanup(func() { _ = os.RemoveAll(orphan) })
	stop(t, l)
	if err := os.RemoveAll(filepath.Dir(gone)); err != nil {
		t.Fatal(err)
	}

	l2, _ := startLocal(t, filepath.Join(closed(), "carehub"), postgres.LocalConfig{Unsafe: true})
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(l2.DataDir())) })
	if _, err := os.Stat(orphan); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the cluster of the deleted data dir %s is still in %s (%v)", gone, orphan, err)
	}
	stop(t, l2)
}

// An attached server dies with its parent, so a killed test binary leaves none behind, and
// the next start recovers its data dir.
func TestLocalAttachedDiesWithParent(t *testing.T) {
	dir := testenv.ClusterDir(t)
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), helperEnv+"="+dir)
	helper.Stderr = os.Stderr
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = helper.Process.Kill(); _ = helper.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if !strings.HasPrefix(line, "ready ") {
		t.Fatalf("helper: %q, %v", line, err)
	}
	dataDir := strings.TrimSpace(strings.TrimPrefix(line, "ready "))
	pid := readPID(t, dataDir)
	t.Cleanup(func() { // should the test fail, leave no server behind
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); err == nil && strings.Contains(string(b), dataDir) {
			_ = syscall.Kill(pid, syscall.SIGQUIT)
		}
	})

	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	waitGone(t, pid)

	l, took := startLocal(t, dir, postgres.LocalConfig{Attached: true})
	t.Logf("attached start after the parent was killed: %v", took)
	if got := scalar(t, l.DSN("postgres"), "SELECT current_setting('fsync')"); got != "on" {
		t.Errorf("fsync = %s without Unsafe", got)
	}
	stop(t, l)
	if _, err := os.Stat(filepath.Join(l.DataDir(), "postmaster.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("attached server still running after Stop: %v", err)
	}
	stop(t, l)
}

func startLocal(t testing.TB, dir string, cfg postgres.LocalConfig) (*postgres.Local, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	begin := time.Now()
	l, err := postgres.StartLocal(ctx, dir, cfg)
	took := time.Since(begin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Stop(context.Background()) })
	return l, took
}

func stop(t *testing.T, l *postgres.Local) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// scalar runs a one-value query on a connection of its own.
func scalar(t *testing.T, dsn, sql string) string {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var v string
	if err := conn.QueryRow(context.Background(), sql).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func postmasterPID(t *testing.T, l *postgres.Local) int {
	t.Helper()
	return readPID(t, l.DataDir())
}

func readPID(t *testing.T, dataDir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// waitGone waits until pid has exited (a zombie counts as exited: nobody may reap it).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return
		}
		if s := string(b); s[strings.LastIndexByte(s, ')')+2] == 'Z' {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still running", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
