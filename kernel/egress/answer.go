package egress

import (
	"errors"
	"net/http"
	"unicode/utf8"
)

// MaxAnswerHeaderBytes bounds the headers of an answer from a destination that callers choose
// (http.Transport.MaxResponseHeaderBytes, whose default is 10 MiB): a receiver needs no more to
// say 2xx, and attempts in flight at once (hundreds) must not each hold megabytes of a hostile
// receiver's headers.
const MaxAnswerHeaderBytes = 64 << 10

// MaxErrorText bounds the text of an error about a destination that carehub stores or logs:
// net/http quotes what a destination sent in some of its errors (a malformed header line, whole).
const MaxErrorText = 512

// ErrProtocolSwitch is returned (wrapped) when a destination answers 101 Switching Protocols.
var ErrProtocolSwitch = errors.New("the receiver switched protocols (101)")

// Guard wraps rt, the transport of a client that calls destinations callers choose, so that
// reading an answer never outlives its request. net/http hands back a 101 Switching Protocols
// answer's connection as its body, and the request's context no longer bounds reads from it: a
// receiver that switches and then says nothing would hold the reader, and the caller's slot for
// attempts in flight, until it hung up. None of carehub's calls to such destinations switches
// protocols, so Guard refuses every 101 answer and closes its connection, whatever headers the
// request carried (a FHIR rest-hook's may be its owner's).
func Guard(rt http.RoundTripper) http.RoundTripper { return guard{rt} }

type guard struct{ rt http.RoundTripper }

func (g guard) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := g.rt.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		return resp, err
	}
	resp.Body.Close()
	return nil, ErrProtocolSwitch
}

// CloseIdleConnections closes rt's idle connections, as http.Client.CloseIdleConnections asks.
func (g guard) CloseIdleConnections() {
	if c, ok := g.rt.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// Clip returns s cut to at most n bytes at a character boundary: for text carehub did not write
// (a destination's answer, an error that quotes it, a client's string) that it stores or echoes.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
