package outbox

// Queued is how many calls wait for a group transaction, for tests that line calls up.
func (g *Group) Queued() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue)
}
