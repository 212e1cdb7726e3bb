//go:build !unix

package node

// openFileLimit is unknown off Unix: the connection cap is taken as configured.
func openFileLimit() (uint64, bool) { return 0, false }
