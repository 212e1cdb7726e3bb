package postgres

import "time"

// SetClock sets the clock APIKeys shows a rotated key's expiry by (tests of the grace period).
func (s *APIKeys) SetClock(now func() time.Time) { s.now = now }
