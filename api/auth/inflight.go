package auth

import "sync"

// DefaultMaxInFlight is how many requests one credential may have in progress on a node at
// once (Limits.InFlight): far more than a device fleet or an export job keeps open, and a
// bound on what one key can hold of a node's connections and handlers whatever its rate, such
// as requests whose bodies arrive a byte at a time.
const DefaultMaxInFlight = 256

// inFlight counts the requests each credential has in progress.
type inFlight struct {
	max int
	mu  sync.Mutex
	n   map[string]int // by key id; an entry exists only while its count is positive
}

func newInFlight(max int) *inFlight { return &inFlight{max: max, n: map[string]int{}} }

// acquire counts a request of id in, unless id has max in progress already.
func (f *inFlight) acquire(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[id] >= f.max {
		return false
	}
	f.n[id]++
	return true
}

// release counts a request of id out.
func (f *inFlight) release(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[id]--; f.n[id] <= 0 {
		delete(f.n, id)
	}
}
