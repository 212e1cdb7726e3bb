package ws

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
)

// The buffers a socket reads and writes its frames through, in place of net/http's 4 KiB each
// (held for as long as the socket is open, which for thousands of idle subscribers is most of
// what they cost besides their goroutines). Client messages are small (subscribe, ping, stop);
// most server messages are one event's answer of a few hundred bytes, written in one system
// call as long as it fits with its frame header. A larger frame is written past the buffer, as
// net/http's would be past its own.
const (
	readBufferBytes  = 1 << 10
	writeBufferBytes = 2 << 10
)

// smallBuffers hands websocket.Accept a hijacked connection with the buffers above.
type smallBuffers struct{ http.ResponseWriter }

// Unwrap lets http.ResponseController and the library reach the writer underneath.
func (w smallBuffers) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack implements http.Hijacker. Whatever net/http had already read past the upgrade request
// (a client may send its first frame without waiting for the 101) is in the new reader's buffer,
// where websocket.Accept looks for it (it resets the reader onto the connection).
func (w smallBuffers) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	if n := brw.Writer.Buffered(); n > 0 { // net/http hands over an empty one; in case it does not
		if err := brw.Writer.Flush(); err != nil {
			_ = conn.Close()
			return nil, nil, err
		}
	}
	br := bufio.NewReaderSize(conn, readBufferBytes)
	if n := brw.Reader.Buffered(); n > 0 {
		early, _ := brw.Reader.Peek(n)
		br = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(early)), conn), max(n, readBufferBytes))
		if _, err := br.Peek(n); err != nil {
			_ = conn.Close()
			return nil, nil, err
		}
	}
	return conn, bufio.NewReadWriter(br, bufio.NewWriterSize(conn, writeBufferBytes)), nil
}
