package ws

import (
	"bufio"
	"encoding/binary"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A client that sends its connection_init in the same write as the upgrade request (net/http
// has read the frame into its own buffer by the time the socket is hijacked) is acknowledged:
// the frame reaches the socket's smaller reader.
func TestFrameSentWithTheUpgradeIsRead(t *testing.T) {
	ts := newTestServer(t, Config{})
	conn, err := net.Dial("tcp", strings.TrimPrefix(ts.url, "ws://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(ioTimeout))

	init := []byte(`{"type":"connection_init","payload":{"Authorization":"Bearer ` + keyAlice + `"}}`)
	upgrade := "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n" +
		"Sec-WebSocket-Protocol: " + ProtocolTransportWS + "\r\n\r\n"
	if _, err := conn.Write(append([]byte(upgrade), maskedText(init)...)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s", resp.Status)
	}
	var h [2]byte
	if _, err := br.Read(h[:1]); err != nil {
		t.Fatal(err)
	}
	if _, err := br.Read(h[1:]); err != nil {
		t.Fatal(err)
	}
	if h[0] != 0x81 || h[1]&0x80 != 0 || h[1] >= 126 {
		t.Fatalf("first frame header %x: want a short unmasked text frame", h)
	}
	msg := make([]byte, h[1])
	if _, err := br.Read(msg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(msg), `"connection_ack"`) {
		t.Fatalf("first message %s: want connection_ack", msg)
	}
}

// maskedText frames p as a client's text frame (mask key zero: the payload goes as it is).
func maskedText(p []byte) []byte {
	f := []byte{0x81}
	switch {
	case len(p) < 126:
		f = append(f, 0x80|byte(len(p)))
	default:
		f = append(f, 0x80|126)
		f = binary.BigEndian.AppendUint16(f, uint16(len(p)))
	}
	f = append(f, 0, 0, 0, 0)
	return append(f, p...)
}
