// Package writeback has the kernel write a data dir's files back to disk as they are written,
// rather than in bursts.
//
// Linux keeps written pages dirty in the page cache until they are older than
// vm.dirty_expire_centisecs (30 s by default) or until dirty pages pass
// vm.dirty_background_ratio of memory (10 %: gigabytes on a server), and then writes them back
// all at once. Under a steady write load that is a burst of hundreds of megabytes every 30 s,
// and every fsync meanwhile (a Postgres commit flushing its WAL) waits behind it. PostgreSQL
// avoids this for what its checkpointer and background writer write (checkpoint_flush_after,
// bgwriter_flush_after), not for the pages a backend writes when it extends a table or an
// index, which a bulk COPY does all the time: those sat dirty until the kernel's 30-s burst,
// which stalled the observation writer for one to two seconds, 30 s into every load on the
// embedded defaults (2026-12-01, docs/PERFORMANCE.md).
//
// A Pacer asks the kernel every interval to start writing back the files of a directory tree
// written since its last round (sync_file_range with SYNC_FILE_RANGE_WRITE: it starts the
// writes and does not wait for them), so the same bytes go to disk as a steady stream. It
// changes nothing the files' owners rely on: it does not make anything durable that was not
// (that is still fsync's job), and it only reads the tree.
package writeback

import (
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// DefaultInterval is how often a Pacer starts writeback: a second's writes at a time.
const DefaultInterval = time.Second

// Pacer starts the writeback of the files under a directory every interval until Stop.
type Pacer struct {
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// Start returns a Pacer of the regular files under root (a file that is a symbolic link is not
// followed; root itself may be one). Where the kernel cannot be asked (not Linux), it does
// nothing.
func Start(root string, interval time.Duration, logger *slog.Logger) *Pacer {
	p := &Pacer{stop: make(chan struct{}), done: make(chan struct{})}
	if !supported {
		close(p.done)
		return p
	}
	if resolved, err := filepath.EvalSymlinks(root); err == nil {
		root = resolved
	}
	go p.run(root, interval, logger)
	return p
}

// Stop ends the Pacer and waits for its round in progress. It is idempotent.
func (p *Pacer) Stop() {
	p.once.Do(func() { close(p.stop) })
	<-p.done
}

func (p *Pacer) run(root string, interval time.Duration, logger *slog.Logger) {
	defer close(p.done)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	since := time.Now()
	failing := false
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
		// From a round back: a file written while the last round walked past it is not missed.
		began := time.Now()
		_, err := Round(root, since.Add(-interval))
		since = began
		switch {
		case err != nil && !failing:
			logger.Warn("cannot start the writeback of a data dir; the kernel writes it back on its own", "dir", root, "err", err)
			failing = true
		case err == nil && failing:
			logger.Info("writeback of a data dir started again", "dir", root)
			failing = false
		}
	}
}

// Round starts the writeback of every regular file under root modified at or after since and
// returns how many it asked for. A file that goes away or cannot be opened meanwhile is passed
// over (a table dropped, a segment deleted); the error is the first the kernel gave for a file
// it could open.
func Round(root string, since time.Time) (int, error) {
	var first error
	n := 0
	walkErr := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil && path == root:
			return err // nothing to walk
		case err != nil || !d.Type().IsRegular():
			return nil
		}
		info, err := d.Info()
		if err != nil || info.ModTime().Before(since) {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return nil
		}
		if err := startWriteback(f); err != nil && first == nil {
			first = err
		}
		f.Close()
		n++
		return nil
	})
	if first == nil {
		first = walkErr
	}
	return n, first
}
