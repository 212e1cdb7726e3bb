package kafka

import (
	"strings"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// CommitWatch notices franz-go ending a transaction with an abort although asked to commit, and
// reporting success: in v1.22.3, under KIP-890 part 2, EndTransaction(TryCommit) aborts when it
// holds no partition as added to the transaction and returns nil (seen under load, the records
// acknowledged; issue 52). Its log line is the only sign. Give Watch as ClientConfig.Watch of the
// transactional client, Reset before a transaction, and read Swallowed after ending it. The
// line's wording is v1.22.3's (txn.go, EndTransaction): an upgrade must check it still is.
type CommitWatch struct{ seen atomic.Bool }

// Watch is a ClientConfig.Watch.
func (w *CommitWatch) Watch(_ kgo.LogLevel, msg string) {
	if strings.HasPrefix(msg, "no produce succeeded in this transaction but produces were attempted") {
		w.seen.Store(true)
	}
}

// Reset forgets the sign: call it before the transaction it is to speak of.
func (w *CommitWatch) Reset() { w.seen.Store(false) }

// Swallowed reports whether franz-go gave the sign since Reset.
func (w *CommitWatch) Swallowed() bool { return w.seen.Load() }
