package loadtest

import (
	"time"

	"carehub/loadtest/loadcli"
)

// CPU is the CPU time a -self run's two halves have used so far: this process (the devices,
// intake, the embedded broker, the writer) and the local Postgres cluster. Divided by the
// observations stored it is the pipeline's cost per observation, which moves less than the
// rates do on a shared machine (docs/PERFORMANCE.md: about 4 % against a fifth). The cluster's
// half needs /proc (postgres.Local.CPUTime); elsewhere the run reports no CPU.
func (s *Stack) CPU() (process, postgres time.Duration, err error) {
	postgres, err = s.local.CPUTime()
	return loadcli.ProcessCPU(), postgres, err
}
