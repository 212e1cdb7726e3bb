//go:build carehub_crashtest

package idempotency

import (
	"os"
	"syscall"
)

// CrashAfterStepEnv, set in the environment of a binary built with -tags carehub_crashtest,
// makes the process kill itself with SIGKILL right after a step has committed: after the
// effect, before the answer is recorded, the point a crash test must hit. Release builds do not
// contain this file.
const CrashAfterStepEnv = "CAREHUB_CRASH_AFTER_STEP"

func afterStep() {
	if os.Getenv(CrashAfterStepEnv) == "" {
		return
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL cannot be caught; nothing after the commit runs
}
