package publish

import "context"

// Flush waits until the broker has every record added so far, so a test can abort a
// transaction whose records are in the log (and must stay unread).
func (t *Txn) Flush(ctx context.Context) error { return t.cl.Flush(ctx) }

// Swallow marks slot's transaction as one franz-go aborted although asked to commit, as its log
// line does.
func (p *Transactional) Swallow(slot int) {
	p.commits[slot].Watch(0, "no produce succeeded in this transaction but produces were attempted")
}
