//go:build !unix

package kafka

import "os"

// lockDir opens path without locking: off unix, nothing stops two processes
// from sharing a data dir, so do not.
func lockDir(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
}
