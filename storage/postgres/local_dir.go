package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// account is the OS user the server runs as.
type account struct {
	uid, gid uint32
	groups   []uint32 // supplementary groups, for the traversal check
	home     string
	// cred is set when the programs must be started as this user: carehub runs as root,
	// which PostgreSQL refuses to run as.
	cred *syscall.Credential
}

func serverAccount() (account, error) {
	if os.Geteuid() != 0 {
		return account{uid: uint32(os.Geteuid()), gid: uint32(os.Getegid())}, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return account{}, errors.New("local postgres: carehub runs as root, which PostgreSQL refuses to run as, and there is no 'postgres' system user to run it as: install postgresql (apt-get install -y postgresql creates the user), or run carehub as a non-root user")
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return account{}, fmt.Errorf("local postgres: user postgres: %w", err)
	}
	a := account{uid: uint32(uid), gid: uint32(gid), home: u.HomeDir}
	gids, _ := u.GroupIds()
	for _, g := range gids {
		if n, err := strconv.ParseUint(g, 10, 32); err == nil {
			a.groups = append(a.groups, uint32(n))
		}
	}
	a.cred = &syscall.Credential{Uid: a.uid, Gid: a.gid, Groups: a.groups}
	return a, nil
}

// chown hands path to the server's user when carehub runs as root.
func (a account) chown(path string) error {
	if a.cred == nil {
		return nil
	}
	return os.Lchown(path, int(a.uid), int(a.gid))
}

// mayEnter reports whether the account can traverse the directory described by fi.
func (a account) mayEnter(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return true
	}
	mode := fi.Mode().Perm()
	switch {
	case st.Uid == a.uid:
		return mode&0o100 != 0
	case st.Gid == a.gid || slices.Contains(a.groups, st.Gid):
		return mode&0o010 != 0
	default:
		return mode&0o001 != 0
	}
}

// blockedAncestor returns the first ancestor of dir (dir excluded) that the account cannot
// traverse, or "" when there is none. It ignores ACLs, so it can only err towards relocating.
func (a account) blockedAncestor(dir string) string {
	var ancestors []string
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		ancestors = append(ancestors, p)
		if p == filepath.Dir(p) {
			break
		}
	}
	slices.Reverse(ancestors)
	for _, p := range ancestors {
		fi, err := os.Stat(p)
		if err != nil || !a.mayEnter(fi) {
			return p
		}
	}
	return ""
}

// place decides where the cluster of dir lives and returns that directory (the cluster
// root). It is dir itself, except when carehub runs as root and user postgres cannot reach
// dir: then the cluster goes to postgres's home, and dir/data links to it.
//
// Relocating beats failing: `carehub serve` as root from a checkout under /root just works,
// and the data stays on persistent storage (unlike a fallback under /tmp). The link keeps
// "delete the data dir to start over" true: a cluster whose link is gone is removed.
func (l *Local) place(ctx context.Context, dir string) (string, error) {
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", err
	}
	if l.acct.cred == nil {
		return dir, nil
	}
	blocked := l.acct.blockedAncestor(dir)
	if blocked == "" {
		return dir, nil
	}
	fail := func(why string) error {
		return fmt.Errorf("PostgreSQL runs as user postgres, which cannot traverse %s to reach %s, and %s: use a data dir that user postgres can reach (e.g. under /var/lib or /tmp) or set CAREHUB_DATABASE_URL", blocked, dir, why)
	}
	if l.acct.home == "" || l.acct.blockedAncestor(l.acct.home) != "" {
		return "", fail("its home directory cannot hold the cluster instead")
	}
	if fi, err := os.Stat(l.acct.home); err != nil || !fi.IsDir() || fi.Sys().(*syscall.Stat_t).Uid != l.acct.uid {
		return "", fail(fmt.Sprintf("its home directory %s is not a directory it owns", l.acct.home))
	}
	base := filepath.Join(l.acct.home, "carehub")
	root := filepath.Join(base, shortHash(dir))
	link, target := filepath.Join(dir, "data"), filepath.Join(root, "data")

	fi, err := os.Lstat(link)
	switch {
	case err == nil && fi.Mode()&fs.ModeSymlink == 0:
		return "", fail(link + " is a cluster in place already")
	case err == nil:
		if dest, _ := os.Readlink(link); dest != target {
			return "", fmt.Errorf("%s links to %s, not to this data dir's cluster %s", link, dest, target)
		}
	case errors.Is(err, fs.ErrNotExist):
		if _, err := os.Stat(target); err == nil {
			l.logger.Warn("local postgres: the data dir was deleted; removing its relocated cluster",
				"data_dir", dir, "cluster_dir", root)
			stale := l.relocatedAt(root)
			if _, running := stale.running(); running {
				out, err := stale.command(ctx, "pg_ctl", "stop", "-D", target, "-m", "immediate", "-w").CombinedOutput()
				if err != nil {
					return "", cmdError("stop the relocated cluster of a deleted data dir", err, out)
				}
			}
			if err := os.RemoveAll(target); err != nil {
				return "", err
			}
		}
		if err := os.Symlink(target, link); err != nil {
			return "", err
		}
	default:
		return "", err
	}
	if err := l.mkdirOwned(base); err != nil {
		return "", err
	}
	l.sweepTemporary(base, root)
	if err := l.mkdirOwned(root); err != nil {
		return "", err
	}
	// For whoever finds this directory: which data dir it belongs to.
	if err := os.WriteFile(filepath.Join(root, "origin"), []byte(dir+"\n"), 0o644); err != nil {
		return "", err
	}
	l.logger.Info("local postgres: user postgres cannot reach the data dir, so the cluster lives in its home",
		"data_dir", dir, "not_traversable", blocked, "cluster_dir", root)
	return root, nil
}

// sweepTemporary removes the relocated clusters in base (but keep's) whose data dir was inside
// a directory of the temporary directory that is gone as a whole: a test's or a load test's,
// deleted with its tree, which nothing would ever start again to remove its cluster. Each left
// 140 MB to 3.4 GB in postgres's home (141 of them, 23 GB, on the development machine by
// 2026-11-30). A data dir elsewhere that is missing may be on a volume not mounted yet (and so
// may one under an odd TMPDIR whose top directory still exists), so its cluster stays until
// that dir is used again (place). A cluster that still runs is left for a later sweep.
func (l *Local) sweepTemporary(base, keep string) {
	tmp, err := filepath.EvalSymlinks(os.TempDir())
	if err != nil {
		return
	}
	entries, _ := os.ReadDir(base)
	for _, e := range entries {
		root := filepath.Join(base, e.Name())
		origin, err := os.ReadFile(filepath.Join(root, "origin"))
		dir := strings.TrimSpace(string(origin))
		rel, ok := strings.CutPrefix(dir, tmp+string(filepath.Separator))
		if err != nil || root == keep || !ok || rel == "" {
			continue
		}
		top, _, _ := strings.Cut(rel, string(filepath.Separator))
		if _, err := os.Lstat(filepath.Join(tmp, top)); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		stale := l.relocatedAt(root)
		if _, running := stale.running(); running {
			continue
		}
		if err := os.RemoveAll(root); err != nil {
			l.logger.Warn("local postgres: cannot remove the cluster of a deleted temporary data dir", "cluster_dir", root, "err", err)
			continue
		}
		l.logger.Info("local postgres: removed the cluster of a deleted temporary data dir", "data_dir", dir, "cluster_dir", root)
	}
}

// relocatedAt is the relocated cluster in root, with l's binaries and user: for stopping or
// checking a cluster other than l's own.
func (l *Local) relocatedAt(root string) *Local {
	return &Local{bin: l.bin, acct: l.acct, logger: l.logger, root: root, dataDir: filepath.Join(root, "data")}
}

// mkdirOwned makes dir exist as a 0700 directory of the server's user. The directories it
// is used on belong to the cluster, so an existing one is taken over.
func (l *Local) mkdirOwned(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != l.acct.uid {
		if l.acct.cred == nil {
			return fmt.Errorf("%s belongs to uid %d, not to this user (uid %d)", dir, st.Uid, l.acct.uid)
		}
		if err := l.acct.chown(dir); err != nil {
			return err
		}
	}
	if fi.Mode().Perm() != 0o700 {
		return os.Chmod(dir, 0o700)
	}
	return nil
}

// shortHash names a directory after another, stably and briefly.
func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}
