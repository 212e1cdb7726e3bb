package postgres

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"carehub/storage/writeback"
)

// ErrBinariesNotFound is returned by FindBinaries and StartLocal when no PostgreSQL server
// installation is found.
// ClockTick is the unit of the CPU times in /proc/stat and /proc/<pid>/stat (USER_HZ, 100 on
// every Linux build).
const ClockTick = 10 * time.Millisecond

var ErrBinariesNotFound = errors.New("PostgreSQL server binaries not found (initdb, pg_ctl, postgres): install postgresql (apt-get install -y postgresql)")

const (
	localPort = 5432
	localUser = "carehub"
	// socketName is the file the server creates in its socket directory for localPort.
	socketName = ".s.PGSQL.5432"
	// maxSocketPath is sizeof(sockaddr_un.sun_path) minus the terminating NUL: the server
	// refuses to start when socket directory + "/" + socketName is longer.
	maxSocketPath = 107
	// defaultWait bounds pg_ctl start/stop when the context has no deadline.
	defaultWait = 60 * time.Second
)

// FindBinaries returns the directory holding the PostgreSQL server programs (initdb, pg_ctl,
// postgres): the one `pg_config --bindir` names if it has them, else the newest
// /usr/lib/postgresql/*/bin (Debian's layout, where pg_config may come from libpq-dev and
// point elsewhere). It returns ErrBinariesNotFound when neither has them.
func FindBinaries() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); hasServerBinaries(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(dir string) float64 {
		v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64)
		if err != nil {
			return math.Inf(-1)
		}
		return v
	}
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, dir := range dirs {
		if hasServerBinaries(dir) {
			return dir, nil
		}
	}
	return "", ErrBinariesNotFound
}

func hasServerBinaries(dir string) bool {
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// LocalConfig configures StartLocal. Zero fields take their defaults.
type LocalConfig struct {
	// Logger receives the server's start-up and shutdown events. Default: discard.
	Logger *slog.Logger
	// Unsafe trades durability for speed: fsync, full_page_writes and synchronous_commit off
	// and initdb without syncing. A crash of the machine (not of the server) can corrupt the
	// cluster, so it is for throwaway test clusters only.
	Unsafe bool
	// Attached runs the postmaster as a child of this process instead of daemonizing it
	// through pg_ctl, and has the kernel send it SIGQUIT (immediate shutdown) when this process
	// dies, so a killed or panicking test binary leaves no server behind. Without it a server
	// outlives a carehub that is SIGKILLed, and the next StartLocal on the same dir adopts it.
	Attached bool
}

func (c *LocalConfig) defaults() { c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler)) }

// Local is a PostgreSQL cluster that carehub creates and runs itself with the system's
// PostgreSQL binaries: the embedded default of `carehub serve`, and the test clusters of
// pgtest. It listens on a unix socket only (no TCP) and trusts local connections, so access
// is governed by the socket directory's permissions (0700, the server's user).
//
// Its methods are safe for concurrent use.
type Local struct {
	bin     string
	acct    account
	logger  *slog.Logger
	cfg     LocalConfig
	root    string // owned by the server's user: data/, postgres.log, run/
	dataDir string
	logPath string
	sockDir string

	reused bool // the server was already running when StartLocal found it

	mu      sync.Mutex
	stopped bool
	proc    *os.Process   // the postmaster, in attached mode only
	exited  chan struct{} // closed when the attached postmaster has exited

	// pacer has the kernel write back the tables' and indexes' pages as they are written
	// (package writeback), on a durable cluster; nil on an Unsafe one, which never syncs.
	pacer *writeback.Pacer

	// superviseStop ends the supervision (local_supervise.go); superviseDone is closed once
	// it has ended. Both nil on a Local that is not supervised.
	superviseStop, superviseDone chan struct{}
	superviseOnce                sync.Once
}

// StartLocal starts the cluster kept under dir, creating it with initdb on first use, and
// returns once it accepts connections. dir belongs to the cluster: nothing else should
// write there. StartLocal reuses what it finds: an existing cluster, and a postmaster still
// running from an earlier process that died without stopping it (unless Attached, which
// restarts it as its own child). A stale postmaster.pid left by a crash does not block it.
//
// PostgreSQL refuses to run as root. When carehub runs as root, the server runs as the
// system user postgres (created by the Debian/Ubuntu package) and dir is handed to that
// user. If postgres cannot traverse dir's parents (say, dir is under /root), the cluster is
// placed in postgres's home directory instead, under carehub/<hash of dir>, and dir/data is
// a symbolic link to it; deleting dir deletes that cluster on the next start.
//
// The unix socket lives in dir/run unless that path is too long for a socket address; then
// in /tmp/carehub-pg-<hash of dir>.
func StartLocal(ctx context.Context, dir string, cfg LocalConfig) (*Local, error) {
	begin := time.Now()
	cfg.defaults()
	l := &Local{logger: cfg.Logger, cfg: cfg}
	var err error
	if l.bin, err = FindBinaries(); err != nil {
		return nil, err
	}
	if l.acct, err = serverAccount(); err != nil {
		return nil, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, fmt.Errorf("local postgres: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("local postgres: %w", err)
	}
	// Two processes starting on one dir at once would both run initdb; the second to get
	// the lock finds the cluster, and the first's server running, and adopts it.
	unlock, err := lockFile(ctx, filepath.Join(dir, ".start.lock"))
	if err != nil {
		return nil, fmt.Errorf("local postgres: %w", err)
	}
	defer unlock()
	if l.root, err = l.place(ctx, dir); err != nil {
		return nil, fmt.Errorf("local postgres: %w", err)
	}
	l.dataDir = filepath.Join(l.root, "data")
	l.logPath = filepath.Join(l.root, "postgres.log")
	l.sockDir = filepath.Join(l.root, "run")
	if len(l.sockDir)+1+len(socketName) > maxSocketPath {
		// Too long for sun_path. The short name is derived from dir so that it is stable
		// across restarts and distinct per cluster.
		l.sockDir = filepath.Join("/tmp", "carehub-pg-"+shortHash(l.root))
	}
	for _, d := range []string{l.root, l.sockDir} {
		if err := l.mkdirOwned(d); err != nil {
			return nil, fmt.Errorf("local postgres: %w", err)
		}
	}
	created := false
	if _, err := os.Stat(filepath.Join(l.dataDir, "PG_VERSION")); errors.Is(err, fs.ErrNotExist) {
		// initdb works in data.init and renames it, so a data dir without PG_VERSION was not
		// made by carehub: leave it be unless it is empty.
		if err := os.Remove(l.dataDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("local postgres: %s holds no PostgreSQL cluster (no PG_VERSION) and is not empty: move it away", l.dataDir)
		}
		if err := l.initdb(ctx); err != nil {
			return nil, fmt.Errorf("local postgres: %w", err)
		}
		created = true
	}
	if err := l.writeConf(); err != nil {
		return nil, fmt.Errorf("local postgres: %w", err)
	}
	reused, err := l.start(ctx)
	if err != nil {
		return nil, fmt.Errorf("local postgres: %w", err)
	}
	l.reused = reused
	if !cfg.Unsafe {
		l.pacer = writeback.Start(filepath.Join(l.dataDir, "base"), writeback.DefaultInterval, l.logger)
	}
	if !reused { // an adopted server is its starter's to supervise
		l.superviseStop, l.superviseDone = make(chan struct{}), make(chan struct{})
		go l.supervise()
	}
	l.logger.Info("local postgres ready", "data_dir", l.dataDir, "socket_dir", l.sockDir, "log", l.logPath,
		"created", created, "reused_running_server", reused, "duration", time.Since(begin))
	return l, nil
}

// Reused reports whether StartLocal adopted a server that was already running (another carehub
// process's, or one left by a process that died). A short-lived command leaves such a server
// running rather than stopping it under its owner.
func (l *Local) Reused() bool { return l.reused }

// PID returns the pid of the cluster's running postmaster; false when none runs. Tests that
// crash the server on purpose signal it.
func (l *Local) PID() (int, bool) { return l.running() }

// DataDir returns the cluster's data directory (PGDATA).
func (l *Local) DataDir() string { return l.dataDir }

// SocketDir returns the directory of the server's unix socket.
func (l *Local) SocketDir() string { return l.sockDir }

// DSN returns a keyword/value connection string for database as the superuser carehub,
// accepted by pgx and libpq.
func (l *Local) DSN(database string) string {
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable",
		dsnQuote(l.sockDir), localPort, localUser, dsnQuote(database))
}

func dsnQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// EnsureDatabase creates database name unless it exists. Concurrent calls are safe.
func (l *Local) EnsureDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, l.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("ensure database %s: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	err = conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists)
	if err != nil || exists {
		return wrapErr("ensure database "+name, err)
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: another caller won
		return nil
	}
	return wrapErr("ensure database "+name, err)
}

// Stop shuts the server down (fast mode: sessions are ended, transactions rolled back) and
// waits for it to exit. It is idempotent and returns nil when the server is not running.
func (l *Local) Stop(ctx context.Context) error {
	if l.pacer != nil {
		l.pacer.Stop()
	}
	l.endSupervision()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return nil
	}
	var err error
	if l.proc != nil {
		err = l.stopAttached(ctx)
	} else {
		err = l.stopDetached(ctx)
	}
	if err != nil {
		return fmt.Errorf("stop local postgres: %w", err)
	}
	l.stopped = true
	l.logger.Info("local postgres stopped", "data_dir", l.dataDir)
	return nil
}

func (l *Local) stopDetached(ctx context.Context) error {
	if _, ok := l.running(); !ok {
		return nil
	}
	out, err := l.command(ctx, "pg_ctl", "stop", "-D", l.dataDir, "-m", "fast", "-w", "-s",
		"-t", waitSeconds(ctx)).CombinedOutput()
	if err != nil {
		if _, ok := l.running(); !ok { // it went away by itself meanwhile
			return nil
		}
		return cmdError("pg_ctl stop", err, out)
	}
	return nil
}

func (l *Local) stopAttached(ctx context.Context) error {
	if err := l.proc.Signal(syscall.SIGINT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-l.exited:
		return nil
	case <-ctx.Done():
	}
	// Out of time for a fast shutdown: an immediate one still leaves a consistent cluster
	// (crash recovery runs on the next start).
	l.logger.Warn("local postgres: fast shutdown timed out, shutting down immediately", "data_dir", l.dataDir)
	_ = l.proc.Signal(syscall.SIGQUIT)
	select {
	case <-l.exited:
		return nil
	case <-time.After(10 * time.Second):
		_ = l.proc.Kill()
		return fmt.Errorf("postmaster %d ignored SIGINT and SIGQUIT: %w", l.proc.Pid, ctx.Err())
	}
}

// initdb creates the cluster in data.init and renames it to data once complete, so a
// crash during initdb never leaves a half-made cluster that a later start would trust.
func (l *Local) initdb(ctx context.Context) error {
	tmp := filepath.Join(l.root, "data.init")
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	args := []string{"-D", tmp, "-U", localUser, "--auth-local=trust", "--auth-host=reject",
		"-E", "UTF8", "--locale=C", "--no-instructions"}
	if l.cfg.Unsafe {
		args = append(args, "--no-sync")
	}
	if out, err := l.command(ctx, "initdb", args...).CombinedOutput(); err != nil {
		return cmdError("initdb", err, out)
	}
	f, err := os.OpenFile(filepath.Join(tmp, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	// Last in postgresql.conf so carehub's settings win over initdb's; ALTER SYSTEM
	// (postgresql.auto.conf) is read later still and wins over both.
	_, err = f.WriteString("\n# Added by carehub, which rewrites this file on every start.\ninclude = 'carehub.conf'\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "carehub.conf"), nil, 0o600); err != nil {
		return err
	}
	if err := l.acct.chown(filepath.Join(tmp, "carehub.conf")); err != nil {
		return err
	}
	return os.Rename(tmp, l.dataDir)
}

// writeConf rewrites carehub.conf on every start, so settings follow the carehub binary
// (and the socket directory follows dir).
//
// A durable cluster (carehub serve's) is sized for the event hub's write load rather than
// Postgres's conservative defaults: shared_buffers from the machine's memory (sharedBuffersMB),
// the largest WAL buffer that helps (16 MB; a COPY of a batch of events writes megabytes of WAL,
// and a full WAL buffer makes the backend write it out itself), and checkpoints after 2 GB of
// WAL rather than 1 GB (the event log writes about 1 KB of WAL per event: pg_stat_wal counted
// 1.1 GB for 1.05 M events, a checkpoint every few seconds at the defaults). Test clusters
// (Unsafe) keep the defaults.
func (l *Local) writeConf() error {
	durable, sizing := "on", "shared_buffers = 128MB\n"
	if l.cfg.Unsafe {
		durable = "off"
	} else {
		sizing = fmt.Sprintf("shared_buffers = %dMB\nwal_buffers = 16MB\nmax_wal_size = 2GB\n", sharedBuffersMB())
	}
	conf := fmt.Sprintf(`# Written by carehub on every start: changes here are lost. Use ALTER SYSTEM instead.
listen_addresses = ''
port = %d
unix_socket_directories = '%s'
unix_socket_permissions = 0700
max_connections = 200
%sfsync = %s
full_page_writes = %s
synchronous_commit = %s
timezone = 'UTC'
log_timezone = 'UTC'
log_line_prefix = '%%m [%%p] %%q%%u@%%d '
`, localPort, strings.ReplaceAll(l.sockDir, "'", "''"), sizing, durable, durable, durable)
	path := filepath.Join(l.dataDir, "carehub.conf")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(conf), 0o600); err != nil {
		return err
	}
	if err := l.acct.chown(tmp); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// start brings the server up, or adopts one already running on the data dir. It reports
// whether it adopted one.
func (l *Local) start(ctx context.Context) (reused bool, err error) {
	pf, err := l.clearStale(ctx)
	if err != nil {
		return false, err
	}
	if pf != nil { // a live postmaster on our data dir
		if !l.cfg.Attached {
			if err := waitReady(ctx, l.dataDir, nil); err == nil {
				if pf.socketDir != "" && pf.socketDir != l.sockDir {
					// Started by a carehub that chose another socket dir: follow the server.
					l.sockDir = pf.socketDir
				}
				l.logger.Info("local postgres: adopting the server left running by an earlier process", "pid", pf.pid)
				return true, nil
			} else if _, alive := l.running(); alive {
				return false, err
			}
			// It was shutting down; start afresh below.
		} else if err := l.stopDetached(ctx); err != nil {
			return false, err
		}
	}
	if err := l.touchLog(); err != nil {
		return false, err
	}
	if l.cfg.Attached {
		return false, l.startAttached(ctx)
	}
	out, err := l.command(ctx, "pg_ctl", "start", "-D", l.dataDir, "-l", l.logPath, "-w", "-s",
		"-t", waitSeconds(ctx)).CombinedOutput()
	if err != nil {
		return false, fmt.Errorf("%w\n%s", cmdError("pg_ctl start", err, out), l.logTail())
	}
	return false, nil
}

func (l *Local) startAttached(ctx context.Context) error {
	logFile, err := os.OpenFile(l.logPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	cmd := l.command(context.Background(), "postgres", "-D", l.dataDir)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = attachedProcAttr(l.acct.cred)
	started := make(chan error, 1)
	l.exited = make(chan struct{})
	go func() {
		defer close(l.exited)
		defer logFile.Close()
		// The kernel sends the parent-death signal when the thread that forked the child
		// exits, not the process (golang/go#27505): hold this thread until the server exits.
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
		return fmt.Errorf("start postgres: %w", err)
	}
	l.proc = cmd.Process
	if err := waitReady(ctx, l.dataDir, l.exited); err != nil {
		_ = l.proc.Signal(syscall.SIGQUIT)
		select {
		case <-l.exited:
		case <-time.After(10 * time.Second):
			_ = l.proc.Kill()
		}
		return fmt.Errorf("%w\n%s", err, l.logTail())
	}
	return nil
}

// command runs a PostgreSQL program as the server's user, in the cluster's root (a
// directory that user can enter: the programs fail when they cannot resolve their cwd).
func (l *Local) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(l.bin, name), args...)
	cmd.Dir = l.root
	cmd.WaitDelay = 5 * time.Second
	for _, kv := range os.Environ() {
		// PGDATA, PGHOST, PGOPTIONS... of the caller's shell must not steer our cluster.
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if l.acct.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: l.acct.cred}
	}
	return cmd
}

// touchLog creates postgres.log owned by the server's user, who appends to it.
func (l *Local) touchLog() error {
	f, err := os.OpenFile(l.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return l.acct.chown(l.logPath)
}

// logTail returns the last lines of postgres.log, where the server says why it failed.
func (l *Local) logTail() string {
	f, err := os.Open(l.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > 4096 {
		_, _ = f.Seek(-4096, io.SeekEnd)
	}
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	return l.logPath + ":\n" + strings.Join(lines, "\n")
}

// lockFile takes an exclusive flock on path, waiting for it as long as ctx allows, and
// returns its release.
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("another process is starting the cluster (%s): %w", path, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func waitSeconds(ctx context.Context) string {
	d := defaultWait
	if dl, ok := ctx.Deadline(); ok {
		d = time.Until(dl)
	}
	return strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))
}

func cmdError(what string, err error, out []byte) error {
	return fmt.Errorf("%s: %w: %s", what, err, bytes.TrimSpace(out))
}

func wrapErr(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// sharedBuffersMB is the shared_buffers of a durable cluster: an eighth of the memory the
// machine (or its container) has, between Postgres's default of 128 MB and 1 GB. With these
// settings (1 GB on a 2-core machine with 24 GB), arrays of 1,000 events at 70,000 events/s
// published → logged p99 146–312 ms over eight runs (median 210) against 238–474 ms (median
// 304) with the defaults, runs alternated (docs/PERFORMANCE.md).
func sharedBuffersMB() uint64 {
	const mb = 1 << 20
	total, err := memlimit.FromSystem()
	if cg, cgErr := memlimit.FromCgroup(); cgErr == nil && (err != nil || cg < total) {
		total, err = cg, nil
	}
	if err != nil {
		return 128
	}
	return min(max(total/8/mb, 128), 1024)
}
