package node

import (
	"log/slog"

	"carehub/api/server"
)

// httpLimits is the configured HTTP limits with the connection cap kept to half the process's
// file descriptors (overflow included): the other half stays for what the node itself opens
// (Postgres and Kafka clients, the embedded broker's listener and connections, files), so that a
// flood of clients can never starve them.
func (s *Node) httpLimits() server.HTTPLimits {
	l := s.cfg.HTTP.WithDefaults()
	fds, ok := openFileLimit()
	if max := connBudget(fds); ok && l.MaxConns+l.Overflow() > max {
		s.logger.Warn("HTTP connection cap lowered to half the open-file limit", "configured", l.MaxConns,
			"open_file_limit", fds, "cap", capWithin(max))
		l.MaxConns = capWithin(max)
	}
	s.logger.Debug("HTTP limits", slog.Group("http", "max_conns", l.MaxConns, "read_header_timeout", l.ReadHeaderTimeout,
		"read_timeout", l.ReadTimeout, "write_timeout", l.WriteTimeout, "idle_timeout", l.IdleTimeout), "open_file_limit", fds)
	return l
}

// connBudget is the file descriptors HTTP connections may hold of fds.
func connBudget(fds uint64) int {
	return int(min(fds/2, 1<<30))
}

// capWithin is the largest MaxConns whose overflow still fits in budget.
func capWithin(budget int) int {
	n := budget * 16 / 17
	for n > 1 && n+(server.HTTPLimits{MaxConns: n}).Overflow() > budget {
		n--
	}
	return max(n, 1)
}
