// Package pgtest is carehub's Postgres test environment: one server per test package, a
// template database with every migration applied, and a fresh clone of it per test.
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		pool := pgtest.New(t) // an empty, migrated database of its own, dropped after the test
//		...
//	}
//
// The server is a local cluster, started with the system's PostgreSQL (see
// postgres.StartLocal) in a directory under /dev/shm (tmpfs), or /tmp when that is small;
// or, when CAREHUB_TEST_DATABASE_URL is set, that server (a superuser's URL: tests create
// and drop databases).
//
// The environment is package state, set up by Main: that is what "one server per test
// binary" means. New and NewDSN may be called from parallel tests.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/apikeys"
	"carehub/kernel/ids"
	"carehub/storage/postgres"
)

// EnvURL names the environment variable that points the tests at an existing server.
const EnvURL = "CAREHUB_TEST_DATABASE_URL"

const (
	// dirPrefix names the per-package directories under /tmp; Main removes those whose
	// test binary died without cleaning up.
	dirPrefix = "carehub-pgtest-"
	ownerFile = "owner.pid"
	// setupTimeout bounds starting the server and migrating the template.
	setupTimeout = 2 * time.Minute
)

var env struct {
	admin    *pgxpool.Pool          // to the maintenance database, for CREATE/DROP DATABASE
	dsn      func(db string) string // DSN of database db on the server
	template string                 // the migrated database every test database is cloned from
	setupErr error                  // why Main could not set up, for New to report
	local    *postgres.Local        // the binary's own cluster; nil on a shared server
}

// Main sets up the server and the template database, runs the tests, tears everything
// down and exits the process with the tests' result. Call it from TestMain. It exits with
// status 1, saying why, when the server cannot be set up.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main for a TestMain with work of its own to do after the tests (os.Exit skips
// deferred calls): it returns the exit code instead of exiting.
func Run(m *testing.M) int {
	teardown, err := setup()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		return 1
	}
	code := m.Run()
	if err := teardown(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: teardown: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// CPUTime is the CPU time the test binary's own cluster has used so far (postgres.Local.CPUTime):
// a benchmark's figure for what Postgres spent beside the process. On a shared server
// (CAREHUB_TEST_DATABASE_URL) it is an error.
func CPUTime() (time.Duration, error) {
	if env.local == nil {
		return 0, errors.New("pgtest: the server is not this binary's own")
	}
	return env.local.CPUTime()
}

// New returns a pool on a new database cloned from the migrated template. The pool is
// closed and the database dropped when the test ends.
func New(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dsn := NewDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := postgres.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(pool.Close) // runs before NewDSN's drop: cleanups run last-in first-out
	return pool
}

// NewDSN creates a database cloned from the migrated template and returns its DSN, for
// tests that connect by themselves (such as ones that start the whole server). The
// database is dropped, whoever is still connected, when the test ends.
func NewDSN(t testing.TB) string {
	t.Helper()
	if env.admin == nil {
		t.Fatal("pgtest: no test server: call pgtest.Main(m) from TestMain")
	}
	name := databaseName(t.Name())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// FILE_COPY copies the template's files and checkpoints, which costs little on a
	// cluster without fsync; the default, WAL_LOG, writes every block through the WAL and
	// took twice as long (50 ms against 30 on tmpfs).
	_, err := env.admin.Exec(ctx, "CREATE DATABASE "+ident(name)+" TEMPLATE "+ident(env.template)+" STRATEGY FILE_COPY")
	if err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		// Not the test's context: it is canceled before cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := env.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return env.dsn(name)
}

func setup() (teardown func() error, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	var stop func() error
	if u := os.Getenv(EnvURL); u != "" {
		// A shared server: other test binaries use it at the same time, so this one's
		// template needs a name of its own.
		env.template = "carehub_template_" + randomHex(6)
		env.dsn = func(db string) string { return withDatabase(u, db) }
		stop = func() error { return nil }
	} else {
		env.template = "carehub_template"
		local, dir, err := startLocal(ctx, logger)
		if err != nil {
			return nil, err
		}
		env.dsn, env.local = local.DSN, local
		stop = func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			return errors.Join(local.Stop(ctx), os.RemoveAll(dir))
		}
	}
	teardown = func() error {
		var errs []error
		if env.admin != nil {
			if strings.HasPrefix(env.template, "carehub_template_") {
				errs = append(errs, dropTemplate(env.admin, env.template))
			}
			env.admin.Close()
			env.admin = nil
		}
		return errors.Join(append(errs, stop())...)
	}
	if err := prepareTemplate(ctx, logger); err != nil {
		return nil, errors.Join(err, teardown())
	}
	return teardown, nil
}

// startLocal starts this test binary's cluster in a fresh directory of its own, short
// enough for the socket path and traversable by user postgres when tests run as root.
func startLocal(ctx context.Context, logger *slog.Logger) (*postgres.Local, string, error) {
	reapAbandoned(logger)
	dir, err := os.MkdirTemp(clusterBase(), dirPrefix)
	if err != nil {
		return nil, "", err
	}
	// MkdirTemp makes it 0700; the cluster inside belongs to user postgres when we are root.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, "", errors.Join(err, os.RemoveAll(dir))
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, "", errors.Join(err, os.RemoveAll(dir))
	}
	local, err := postgres.StartLocal(ctx, filepath.Join(dir, "cluster"), postgres.LocalConfig{Logger: logger, Unsafe: true, Attached: true})
	if err != nil {
		return nil, "", errors.Join(err, os.RemoveAll(dir))
	}
	return local, dir, nil
}

func prepareTemplate(ctx context.Context, logger *slog.Logger) error {
	admin, err := postgres.Connect(ctx, env.dsn("postgres"))
	if err != nil {
		return err
	}
	env.admin = admin
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident(env.template)); err != nil {
		return fmt.Errorf("create template database: %w", err)
	}
	pool, err := postgres.Connect(ctx, env.dsn(env.template))
	if err != nil {
		return err
	}
	_, err = postgres.Migrate(ctx, pool, logger)
	pool.Close()
	if err != nil {
		return fmt.Errorf("migrate template database: %w", err)
	}
	// CREATE DATABASE ... TEMPLATE fails while anyone is connected to the template; make
	// sure no one can be.
	_, err = admin.Exec(ctx, "ALTER DATABASE "+ident(env.template)+" WITH ALLOW_CONNECTIONS false")
	return err
}

func dropTemplate(admin *pgxpool.Pool, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)")
	return err
}

// bases are where test clusters may live, preferred first.
var bases = []string{"/dev/shm", "/tmp"}

// clusterBase returns /dev/shm when it is a tmpfs with room to spare, else /tmp. Cloning a
// database took 30 ms on tmpfs and 600 ms on the ext4 under /tmp of a busy machine, even
// with fsync off: the difference between a fast and a slow test suite. Containers often
// give /dev/shm only 64 MB, hence the check.
func clusterBase() string {
	const tmpfsMagic = 0x01021994
	var st syscall.Statfs_t
	if err := syscall.Statfs(bases[0], &st); err == nil && st.Type == tmpfsMagic &&
		st.Bavail*uint64(st.Bsize) >= 1<<30 {
		return bases[0]
	}
	return bases[1]
}

// reapAbandoned removes the directories of earlier test binaries that died without
// tearing down (killed, timed out, panicked): their servers died with them (see
// postgres.LocalConfig.Attached), but the files stay.
func reapAbandoned(logger *slog.Logger) {
	var dirs []string
	for _, base := range bases {
		found, _ := filepath.Glob(filepath.Join(base, dirPrefix+"*"))
		dirs = append(dirs, found...)
	}
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // being created right now, or not ours
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || alive(pid) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			logger.Warn("pgtest: cannot remove abandoned test cluster", "dir", dir, "err", err)
		}
	}
}

// alive reports whether pid is a running process (a zombie is not).
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist) // no /proc: trust kill
	}
	end := strings.LastIndexByte(string(b), ')')
	return end < 0 || end+2 >= len(b) || b[end+2] != 'Z'
}

// databaseName makes a database name from a test name, readable in pg_stat_activity and
// unique by a random suffix (test names repeat with -count and across packages sharing a
// server), within the 63-byte identifier limit.
func databaseName(test string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(test) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	name := b.String()
	if len(name) > 40 {
		name = name[:40]
	}
	return "test_" + name + "_" + randomHex(6)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// withDatabase returns dsn with its database replaced by db. Keyword/value strings take
// the last of repeated keywords.
func withDatabase(dsn, db string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			u.Path = "/" + db
			u.RawPath = ""
			return u.String()
		}
	}
	return dsn + " dbname='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(db) + "'"
}

// NewOrg inserts an organization and returns its id: the parent row an API key or a project of a
// store's test needs.
func NewOrg(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	id := ids.New(ids.Organization)
	if _, err := pool.Exec(context.Background(), `insert into organizations (id, name, slug, type, plan) values ($1, $2, $3, 'clinic', 'starter')`,
		id, "Org "+id, id); err != nil {
		t.Fatalf("insert organization: %v", err)
	}
	return id
}

// NewKey creates an API key in keys and fails the test on error.
func NewKey(t testing.TB, keys *postgres.APIKeys, nk apikeys.NewKey) *apikeys.CreatedKey {
	t.Helper()
	ck, err := keys.Create(context.Background(), nk)
	if err != nil {
		t.Fatalf("create key: %v", err)
	}
	return ck
}
