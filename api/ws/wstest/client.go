// Package wstest is a minimal GraphQL-over-WebSocket client for tests that drive a carehub
// server from outside: dial, authenticate, subscribe, read results. It speaks
// graphql-transport-ws (Dial) and the legacy graphql-ws of subscriptions-transport-ws
// (DialLegacy) through one Client, and runs the npm clients of both (NewNodeClient).
//
// It is deliberately small and strict: it speaks only what each protocol requires of a client
// (connection_init, subscribe or start, complete or stop, ping and pong), and records how each operation
// and the socket ended so a test can assert on it.
package wstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/coder/websocket"
)

// Subprotocol is the graphql-transport-ws subprotocol Dial negotiates; LegacySubprotocol is
// the graphql-ws one DialLegacy negotiates.
const (
	Subprotocol       = "graphql-transport-ws"
	LegacySubprotocol = "graphql-ws"
)

// dialect is what differs between the two protocols on the client's side: the message types
// and the shape of an error message's payload.
type dialect struct {
	subprotocol string
	subscribe   string // starts an operation
	stop        string // ends one from the client
	next        string // carries one result
	// initPayload: send {} in connection_init even without an Authorization.
	initPayload bool
	// errors reads an error message's payload into the GraphQL errors it carries.
	errors func(payload json.RawMessage) []json.RawMessage
}

var (
	transportWS = dialect{
		subprotocol: Subprotocol, subscribe: "subscribe", stop: "complete", next: "next",
		errors: func(payload json.RawMessage) []json.RawMessage {
			var errs []json.RawMessage
			_ = json.Unmarshal(payload, &errs)
			return errs
		},
	}
	legacyWS = dialect{
		subprotocol: LegacySubprotocol, subscribe: "start", stop: "stop", next: "data",
		initPayload: true,
		// graphql-ws sends {"errors": [...]} or, before execution, one error object.
		errors: func(payload json.RawMessage) []json.RawMessage {
			var p struct {
				Errors []json.RawMessage `json:"errors"`
			}
			_ = json.Unmarshal(payload, &p)
			if len(p.Errors) == 0 {
				return []json.RawMessage{payload}
			}
			return p.Errors
		},
	}
)

// maxMessageBytes bounds one server message; generous because results can be large.
const maxMessageBytes = 16 << 20

// OperationError is an operation's error message: the server rejected or failed it.
type OperationError struct {
	ID     string
	Errors []json.RawMessage
}

func (e *OperationError) Error() string {
	msgs := make([]string, 0, len(e.Errors))
	for _, raw := range e.Errors {
		var ge struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(raw, &ge) == nil && ge.Message != "" {
			msgs = append(msgs, ge.Message)
		} else {
			msgs = append(msgs, string(raw))
		}
	}
	return fmt.Sprintf("operation %s failed: %s", e.ID, strings.Join(msgs, "; "))
}

// Client is one socket in either protocol. Its methods are safe for concurrent use.
type Client struct {
	conn *websocket.Conn
	d    dialect
	done chan struct{} // closed when the read goroutine ends

	mu     sync.Mutex
	all    []*sub // every subscription ever made, for Close to stop their pumps
	subs   map[string]*sub
	ended  map[string]error // how each finished operation ended (nil: complete)
	err    error            // why the socket ended, once done is closed
	closed bool
	pongs  []chan struct{} // the Ping calls waiting, oldest first
}

// sub is one operation's result stream. The read loop only appends to pending, so a test
// that does not read one operation never stops the client from reading the socket; pump
// hands the results over in order and closes ch after the last one.
type sub struct {
	ch        chan json.RawMessage
	wake      chan struct{} // capacity 1
	abort     chan struct{} // closed to drop what is pending and close ch now
	abortOnce sync.Once

	mu      sync.Mutex
	pending []json.RawMessage
	ended   bool // nothing more will be added
}

func newSub() *sub {
	s := &sub{ch: make(chan json.RawMessage), wake: make(chan struct{}, 1), abort: make(chan struct{})}
	go s.pump()
	return s
}

func (s *sub) notify() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *sub) add(p json.RawMessage) {
	s.mu.Lock()
	s.pending = append(s.pending, p)
	s.mu.Unlock()
	s.notify()
}

// finish marks the end of the results; with drop, undelivered ones are discarded.
func (s *sub) finish(drop bool) {
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
	s.notify()
	if drop {
		s.abortOnce.Do(func() { close(s.abort) })
	}
}

func (s *sub) pump() {
	defer close(s.ch)
	for {
		s.mu.Lock()
		if len(s.pending) == 0 {
			ended := s.ended
			s.mu.Unlock()
			if ended {
				return
			}
			select {
			case <-s.wake:
			case <-s.abort:
				return
			}
			continue
		}
		p := s.pending[0]
		s.pending = s.pending[1:]
		s.mu.Unlock()
		select {
		case s.ch <- p:
		case <-s.abort:
			return
		}
	}
}

// Message is one protocol message on the wire, in either protocol.
type Message struct {
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Dial opens a graphql-transport-ws socket to url (ws:// or wss://), sends connection_init
// with {"Authorization": authorization} (omitted when empty) and waits for connection_ack, all
// within ctx. When the server refuses the init the error wraps its close frame (use
// websocket.CloseStatus).
func Dial(ctx context.Context, url, authorization string) (*Client, error) {
	return dial(ctx, transportWS, url, authorization)
}

// DialLegacy is Dial in the legacy graphql-ws protocol (subscriptions-transport-ws): start and
// stop, data, error and complete, ka. A refused init is connection_error and then a close
// frame; the error wraps the close.
func DialLegacy(ctx context.Context, url, authorization string) (*Client, error) {
	return dial(ctx, legacyWS, url, authorization)
}

func dial(ctx context.Context, d dialect, url, authorization string) (*Client, error) {
	conn, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{d.subprotocol}})
	if err != nil {
		return nil, fmt.Errorf("wstest: dial %s: %w", url, err)
	}
	conn.SetReadLimit(maxMessageBytes)
	if conn.Subprotocol() != d.subprotocol {
		_ = conn.CloseNow()
		return nil, fmt.Errorf("wstest: server chose subprotocol %q", conn.Subprotocol())
	}
	init := Message{Type: "connection_init"}
	params := map[string]string{}
	if authorization != "" {
		params["Authorization"] = authorization
	}
	if authorization != "" || d.initPayload {
		init.Payload, _ = json.Marshal(params)
	}
	if err := WriteMessage(ctx, conn, init); err != nil {
		_ = conn.CloseNow()
		return nil, fmt.Errorf("wstest: send connection_init: %w", err)
	}
	for {
		m, err := ReadMessage(ctx, conn)
		if err != nil {
			_ = conn.CloseNow()
			return nil, fmt.Errorf("wstest: wait for connection_ack: %w", err)
		}
		switch m.Type {
		case "connection_ack":
			c := &Client{
				conn:  conn,
				d:     d,
				done:  make(chan struct{}),
				subs:  make(map[string]*sub),
				ended: make(map[string]error),
			}
			go c.readLoop()
			return c, nil
		case "ping":
			if err := WriteMessage(ctx, conn, Message{Type: "pong"}); err != nil {
				_ = conn.CloseNow()
				return nil, fmt.Errorf("wstest: answer ping: %w", err)
			}
		case "pong", "ka":
		case "connection_error":
			// graphql-ws: the server closes the socket next; report the close with the message.
			for {
				if _, err := ReadMessage(ctx, conn); err != nil {
					_ = conn.CloseNow()
					return nil, fmt.Errorf("wstest: connection_error %s: %w", m.Payload, err)
				}
			}
		default:
			_ = conn.CloseNow()
			return nil, fmt.Errorf("wstest: unexpected %q before connection_ack", m.Type)
		}
	}
}

// Subscribe starts operation id. The channel yields the payload of each next message (an
// execution result, {"data":...,"errors":...}) in order and closes after the last one, when
// the operation has ended: complete, error or the socket closing (Err(id) then says which),
// or at once on Unsubscribe or Close. Results wait in memory until read, so operations can be
// read in any order; the client never stops reading the socket.
func (c *Client) Subscribe(ctx context.Context, id, query string, vars map[string]any) (<-chan json.RawMessage, error) {
	payload, err := json.Marshal(struct {
		Query     string         `json:"query"`
		Variables map[string]any `json:"variables,omitempty"`
	}{query, vars})
	if err != nil {
		return nil, fmt.Errorf("wstest: encode subscribe %s: %w", id, err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, fmt.Errorf("wstest: subscribe %s: %w", id, errClosed)
	}
	if _, ok := c.subs[id]; ok {
		c.mu.Unlock()
		return nil, fmt.Errorf("wstest: subscribe %s: id in use", id)
	}
	s := newSub()
	c.subs[id] = s
	c.all = append(c.all, s)
	delete(c.ended, id)
	c.mu.Unlock()

	if err := WriteMessage(ctx, c.conn, Message{ID: id, Type: c.d.subscribe, Payload: payload}); err != nil {
		c.end(id, err, true)
		return nil, fmt.Errorf("wstest: send subscribe %s: %w", id, err)
	}
	return s.ch, nil
}

// Ping sends a graphql-transport-ws ping and waits for the pong, within ctx. carehub answers a
// ping once every operation subscribed before it has started, so a Ping after Subscribe returns
// when the server holds the subscription: events from then on reach it.
func (c *Client) Ping(ctx context.Context) error {
	if c.d.subprotocol != Subprotocol {
		return fmt.Errorf("wstest: ping: %s has no ping", c.d.subprotocol)
	}
	pong := make(chan struct{})
	c.mu.Lock()
	c.pongs = append(c.pongs, pong)
	c.mu.Unlock()
	if err := WriteMessage(ctx, c.conn, Message{Type: "ping"}); err != nil {
		return fmt.Errorf("wstest: send ping: %w", err)
	}
	select {
	case <-pong:
		return nil
	case <-c.done:
		return fmt.Errorf("wstest: ping: %w", c.Wait(ctx))
	case <-ctx.Done():
		return fmt.Errorf("wstest: ping: %w", ctx.Err())
	}
}

// Unsubscribe sends complete (legacy: stop) for id; its channel closes and Err(id) is nil.
func (c *Client) Unsubscribe(ctx context.Context, id string) error {
	c.end(id, nil, true)
	if err := WriteMessage(ctx, c.conn, Message{ID: id, Type: c.d.stop}); err != nil {
		return fmt.Errorf("wstest: send %s %s: %w", c.d.stop, id, err)
	}
	return nil
}

// Err reports how operation id ended: nil for complete (or Unsubscribe), *OperationError for
// an error message, the socket's error if it closed first. It is nil while id is running.
func (c *Client) Err(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended[id]
}

// Done is closed when the socket has ended; Wait then returns why.
func (c *Client) Done() <-chan struct{} { return c.done }

// Wait blocks until the socket ends or ctx does and returns the socket's error; a server
// close is a websocket.CloseError (use websocket.CloseStatus).
func (c *Client) Wait(ctx context.Context) error {
	select {
	case <-c.done:
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close ends every operation, closes the socket with 1000 and waits for the read goroutine.
// It is idempotent.
func (c *Client) Close() {
	c.mu.Lock()
	for id := range c.subs {
		c.ended[id] = errClosed
	}
	c.subs = make(map[string]*sub)
	all := c.all
	c.mu.Unlock()
	for _, s := range all {
		s.finish(true)
	}
	_ = c.conn.Close(websocket.StatusNormalClosure, "")
	<-c.done
}

var errClosed = errors.New("wstest: client closed")

func (c *Client) readLoop() {
	defer close(c.done)
	ctx := context.Background()
	var err error
	for err == nil {
		var m Message
		m, err = ReadMessage(ctx, c.conn)
		if err != nil {
			break
		}
		switch m.Type {
		case c.d.next:
			c.mu.Lock()
			s := c.subs[m.ID]
			c.mu.Unlock()
			if s != nil {
				s.add(m.Payload)
			}
		case "error":
			c.end(m.ID, &OperationError{ID: m.ID, Errors: c.d.errors(m.Payload)}, false)
		case "complete":
			c.end(m.ID, nil, false)
		case "ping":
			err = WriteMessage(ctx, c.conn, Message{Type: "pong"})
		case "pong":
			c.mu.Lock()
			if len(c.pongs) > 0 {
				close(c.pongs[0])
				c.pongs = c.pongs[1:]
			}
			c.mu.Unlock()
		}
	}
	c.mu.Lock()
	c.err = err
	c.closed = true
	ids := make([]string, 0, len(c.subs))
	for id := range c.subs {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	for _, id := range ids {
		c.end(id, err, false)
	}
}

// end finishes operation id with err; drop discards its undelivered results.
func (c *Client) end(id string, err error, drop bool) {
	c.mu.Lock()
	s, ok := c.subs[id]
	if ok {
		delete(c.subs, id)
		c.ended[id] = err
	}
	c.mu.Unlock()
	if ok {
		s.finish(drop)
	}
}

// WriteMessage and ReadMessage send and receive one Message on a socket, for tests that speak
// the protocols by hand (a client that stops reading, a malformed message).
func WriteMessage(ctx context.Context, conn *websocket.Conn, m Message) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return conn.Write(ctx, websocket.MessageText, b)
}

func ReadMessage(ctx context.Context, conn *websocket.Conn) (Message, error) {
	_, data, err := conn.Read(ctx)
	if err != nil {
		return Message{}, err
	}
	var m Message
	if err := json.Unmarshal(data, &m); err != nil {
		return Message{}, fmt.Errorf("invalid server message %q: %w", data, err)
	}
	return m, nil
}
