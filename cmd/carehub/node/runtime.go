package node

import (
	"errors"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"sync"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// DefaultGCPercent is the Go collector's target (GOGC) of a carehub process that sets none.
//
// A node allocates for every call and every record, and the collector's work grows with how
// often it runs: at Go's default of 100, marking and assists were about a tenth of a node's CPU
// under single publishEvent calls (docs/PERFORMANCE.md). At 200 it runs half as often, for a
// heap that may grow to three times what is live instead of twice: a node's live heap is tens
// of MiB, and in a container the memory limit below bounds it anyway.
const DefaultGCPercent = 200

var tuneOnce sync.Once

// TuneRuntime sets the collector's target and, in a container with a memory limit, a soft
// memory limit of 90 % of it (automemlimit, reading the cgroup), so that the collector works
// harder as the heap nears the limit rather than the kernel killing the node. GOGC, GOMEMLIMIT
// and AUTOMEMLIMIT in the environment win, as the Go runtime's own settings do. Once per
// process: the settings are the process's, whatever number of nodes it starts. Start calls it;
// a process that assembles a node's parts itself (loadtest's in-process stack) calls it too, so
// that it measures them as a node runs them.
func TuneRuntime(logger *slog.Logger) {
	tuneOnce.Do(func() {
		gogc, ok := os.LookupEnv("GOGC")
		if !ok {
			debug.SetGCPercent(DefaultGCPercent)
			gogc = strconv.Itoa(DefaultGCPercent)
		}
		limit, err := memlimit.Set(memlimit.WithProvider(memlimit.FromCgroup))
		switch {
		case errors.Is(err, memlimit.ErrCgroupsNotSupported):
		case err != nil:
			logger.Warn("could not read the container's memory limit; no soft memory limit set", "err", err)
		default:
			logger.Debug("Go runtime tuned", "gogc", gogc, "memory_limit", limit)
		}
	})
}
