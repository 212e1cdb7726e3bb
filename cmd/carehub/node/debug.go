package node

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// serveDebug serves Go's profiles (/debug/pprof/) on --debug-addr, a loopback address of its
// own: an operator (or the attack soak) profiles a node under load without the profiles being
// reachable where the API is. Nothing is served when the address is empty, the default.
func (s *Node) serveDebug() error {
	if s.cfg.DebugAddr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", s.cfg.DebugAddr)
	if err != nil {
		return fmt.Errorf("listen on --debug-addr %s: %w", s.cfg.DebugAddr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s.debug = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := s.debug.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger.Warn("debug server stopped", "err", err)
		}
	}()
	s.logger.Info("serving profiles", "debug_addr", ln.Addr().String())
	return nil
}
