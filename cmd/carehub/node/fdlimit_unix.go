//go:build unix

package node

import "syscall"

// openFileLimit is the process's soft RLIMIT_NOFILE. The Go runtime has already raised it to the
// hard limit at start (syscall's init, since Go 1.19; children such as the embedded Postgres get
// the original back), so there is nothing left to raise.
func openFileLimit() (uint64, bool) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, false
	}
	return uint64(l.Cur), true
}
