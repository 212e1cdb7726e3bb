// Package testenv decides what a test does when something it needs outside Go is missing (a
// browser, node, a Python tool): it skips, naming what is missing and the command that installs
// it, or, when CAREHUB_REQUIRE_SUITES is set, it fails. CI sets it, so a suite that cannot run
// fails there instead of passing silently.
package testenv

import (
	"os"
	"testing"
)

// RequireEnv names the environment variable that turns Missing's skips into failures.
const RequireEnv = "CAREHUB_REQUIRE_SUITES"

// Missing skips t, or fails it when RequireEnv is set, with the message format, args.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv(RequireEnv) != "" {
		t.Fatalf(format+" ("+RequireEnv+" is set: a suite that cannot run fails)", args...)
	}
	t.Skipf(format, args...)
}
