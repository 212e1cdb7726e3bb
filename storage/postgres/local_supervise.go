package postgres

import (
	"context"
	"time"
)

const (
	// superviseEvery is how often a Local checks that its server still runs.
	superviseEvery = time.Second
	// restartBackoffMax bounds the wait between attempts to start a server that keeps failing.
	restartBackoffMax = 30 * time.Second
)

// supervise starts the server again whenever it has stopped without Stop, until Stop.
//
// PostgreSQL stops by itself when it cannot go on safely, and nothing else would start it
// again: carehub's server is detached (pg_ctl), and a carehub node that outlives it answers
// 503 for good. The case met is a full disk: a server that cannot create its next WAL segment
// PANICs, restarts into crash recovery, cannot write the end-of-recovery checkpoint either,
// and shuts down ("shutting down due to startup process failure"). Started again once space
// returns, it recovers from its WAL and loses nothing committed.
func (l *Local) supervise() {
	defer close(l.superviseDone)
	tick := time.NewTicker(superviseEvery)
	defer tick.Stop()
	backoff := superviseEvery
	var next time.Time
	failedFull := false // the last attempt failed on a full disk
	for {
		select {
		case <-l.superviseStop:
			return
		case <-tick.C:
		}
		// Space returning is what a server that failed on a full disk waits for: try at once.
		if time.Now().Before(next) && !(failedFull && l.DiskFull() == nil) {
			continue
		}
		restarted, err := l.restartIfGone()
		switch {
		case err != nil:
			failedFull = l.DiskFull() != nil
			l.logger.Error("local postgres: the server stopped by itself and does not start again; retrying",
				"data_dir", l.dataDir, "disk_full", failedFull, "err", err, "retry_in_ms", backoff.Milliseconds())
			next = time.Now().Add(backoff)
			backoff = min(2*backoff, restartBackoffMax)
		case restarted:
			l.logger.Warn("local postgres: the server had stopped by itself; started it again", "data_dir", l.dataDir, "log", l.logPath)
			backoff, next, failedFull = superviseEvery, time.Time{}, false
		}
	}
}

// restartIfGone starts the server if it is not running and Stop was not called, and reports
// whether it did.
func (l *Local) restartIfGone() (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return false, nil
	}
	if _, ok := l.running(); ok {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultWait)
	defer cancel()
	if _, err := l.start(ctx); err != nil {
		return false, err
	}
	return true, nil
}

// endSupervision stops the supervision and waits for it; an attempt to start the server in
// progress finishes first. It is idempotent.
func (l *Local) endSupervision() {
	if l.superviseStop == nil {
		return
	}
	l.superviseOnce.Do(func() { close(l.superviseStop) })
	<-l.superviseDone
}
