package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"carehub/internal/testenv"
	"carehub/storage/postgres"
)

// TestLocalDiskFull fills the disk of a local cluster (a tmpfs): DiskFull says so, a write is
// refused with SQLSTATE 53100 and the server stays up; once the space returns DiskFull is nil
// and the write succeeds, without a restart.
func TestLocalDiskFull(t *testing.T) {
	mnt := fullDiskDir(t)
	l, _ := startLocal(t, filepath.Join(mnt, "pg"), postgres.LocalConfig{Unsafe: true})
	conn := connect(t, l.DSN("postgres"))
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `create table filler (b text)`); err != nil {
		t.Fatal(err)
	}
	if err := l.DiskFull(); err != nil {
		t.Fatalf("DiskFull on an empty disk: %v", err)
	}

	filler := fill(t, mnt)
	if err := l.DiskFull(); !errors.Is(err, postgres.ErrDiskFull) {
		t.Fatalf("DiskFull on a full disk: %v, want ErrDiskFull", err)
	}
	_, err := conn.Exec(ctx, `insert into filler select repeat('x', 1000) from generate_series(1, 100000)`)
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != "53100" {
		t.Fatalf("a write on a full disk: %v, want SQLSTATE 53100 disk_full", err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := l.DiskFull(); err != nil {
		t.Fatalf("DiskFull once space returned: %v", err)
	}
	if _, err := conn.Exec(ctx, `insert into filler values ('after')`); err != nil {
		t.Fatalf("a write once space returned: %v", err)
	}
}

// TestLocalRestartsAfterFullDiskShutdown fills the disk until the server cannot create a WAL
// segment: it PANICs, fails its crash recovery for want of space and shuts down. Once the space
// returns the Local starts it again by itself, and every committed update is there.
func TestLocalRestartsAfterFullDiskShutdown(t *testing.T) {
	mnt := fullDiskDir(t)
	l, _ := startLocal(t, filepath.Join(mnt, "pg"), postgres.LocalConfig{}) // durable: a commit is acknowledged once its WAL is written
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, l.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	// Room on each page for updated rows, so updates write WAL without growing the table.
	if _, err := conn.Exec(ctx, `create table t (id int primary key, v int) with (fillfactor = 50);
		insert into t select g, 0 from generate_series(1, 20000) g; checkpoint`); err != nil {
		t.Fatal(err)
	}
	filler := fill(t, mnt)
	committed := 0
	for ; committed < 20000; committed++ {
		if _, err = conn.Exec(ctx, `update t set v = v + 1 where id % 20 = 0`); err != nil {
			break
		}
	}
	// The PANIC ends every session: the client sees its connection closed.
	if !conn.IsClosed() {
		t.Fatalf("after %d updates on a full disk: %v, want the server to PANIC", committed, err)
	}
	_ = conn.Close(ctx)
	testenv.Eventually(t, time.Minute, "the server shut down", func() bool {
		_, err := os.Stat(filepath.Join(l.DataDir(), "postmaster.pid"))
		return errors.Is(err, os.ErrNotExist)
	})

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	var got int
	testenv.Eventually(t, time.Minute, "the server started again", func() bool {
		c, err := pgx.Connect(ctx, l.DSN("postgres"))
		if err != nil {
			return false
		}
		defer func() { _ = c.Close(ctx) }()
		return c.QueryRow(ctx, `select max(v) from t where id % 20 = 0`).Scan(&got) == nil
	})
	if got != committed {
		t.Fatalf("after the restart: %d updates, want the %d committed", got, committed)
	}
}

// fullDiskDir mounts a tmpfs on a directory user postgres can reach, unmounted when the test
// ends (after the cluster on it has stopped).
func fullDiskDir(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root to mount a tmpfs as the full disk")
	}
	mnt := testenv.ClusterDir(t)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=128m,mode=0755", "tmpfs", mnt).CombinedOutput(); err != nil {
		testenv.Missing(t, "cannot mount a tmpfs: %v: %s", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if exec.Command("umount", mnt).Run() != nil {
			_ = exec.Command("umount", "-l", mnt).Run()
		}
	})
	return mnt
}

// fill writes a file in dir until its disk is full, and returns its path.
func fill(t *testing.T, dir string) string {
	t.Helper()
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
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
	return filler
}
