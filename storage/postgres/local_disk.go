package postgres

import (
	"errors"
	"fmt"
	"syscall"
)

// ErrDiskFull is the error of Local.DiskFull.
var ErrDiskFull = errors.New("disk full")

// localDiskReserve is the free space under which DiskFull reports the cluster's disk full: one
// WAL segment. A server that cannot create its next WAL segment stops with a PANIC and then
// cannot finish crash recovery until space returns; a table that cannot grow only fails its
// statement (SQLSTATE 53100 disk_full).
const localDiskReserve = 16 << 20

// DiskFull returns an error wrapping ErrDiskFull when the disk of the cluster's data directory
// has less than one WAL segment free, nil otherwise: what /readyz reports of the embedded
// Postgres's disk before the server refuses writes itself.
func (l *Local) DiskFull() error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(l.dataDir, &st); err != nil {
		return fmt.Errorf("local postgres: free space of %s: %w", l.dataDir, err)
	}
	if free := st.Bavail * uint64(st.Bsize); free < localDiskReserve {
		return fmt.Errorf("%w: the embedded Postgres's disk is full (%.1f MiB free, on %s); writes are refused until space is freed",
			ErrDiskFull, float64(free)/(1<<20), l.dataDir)
	}
	return nil
}
