package observation

// Check is check, for the fuzz test's reference decoder.
func (m *Message) Check() error { return m.check() }
