package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	loadreport "carehub/loadtest/report"
)

const eventStreamQuery = `subscription($projectId: ID!, $types: [String!]) {
  eventStream(projectId: $projectId, types: $types) { id type payload timestamp }
}`

// fleet is the set of subscribed connections. Each connection has one goroutine that reads it
// and timestamps every result; the payload is scanned for the two numbers the report needs
// rather than decoded, so the client spends as little of the machine's CPU as it can.
type fleet struct {
	url string
	key string
	hc  *http.Client

	measuring atomic.Bool // results count only while set
	fromCall  hist        // publish call start → received (payload.sentAt)
	fromEvent hist        // event timestamp (createdAt) → received
	handshake hist        // dial start → connection_ack
	received  atomic.Int64
	open      atomic.Int64
	rec       *loadreport.Recorder // the progress line and report series; nil: none

	mu     sync.Mutex
	conns  []*websocket.Conn
	closes map[string]int // how connections ended before the run did

	wg sync.WaitGroup
}

func newFleet(url, key string) *fleet {
	return &fleet{url: url, key: key, closes: map[string]int{},
		hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: -1}}}
}

type wireMessage struct {
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// connect opens one connection, authenticates and subscribes to eventStream(project, types); its
// reader runs until ctx ends or the server closes it.
func (f *fleet) connect(ctx, readCtx context.Context, project string, types []string) error {
	start := time.Now()
	conn, _, err := websocket.Dial(ctx, f.url, &websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}, HTTPClient: f.hc})
	if err != nil {
		return err
	}
	conn.SetReadLimit(4 << 20)
	fail := func(err error) error {
		_ = conn.CloseNow()
		return err
	}
	init, _ := json.Marshal(map[string]string{"Authorization": "Bearer " + f.key})
	if err := write(ctx, conn, wireMessage{Type: "connection_init", Payload: init}); err != nil {
		return fail(err)
	}
	_, data, err := conn.Read(ctx)
	if err != nil {
		return fail(fmt.Errorf("connection_init: %w", err))
	}
	var ack wireMessage
	if json.Unmarshal(data, &ack) != nil || ack.Type != "connection_ack" {
		return fail(fmt.Errorf("connection_init answered with %.200s", data))
	}
	f.handshake.record(time.Since(start))
	payload, _ := json.Marshal(map[string]any{"query": eventStreamQuery, "variables": map[string]any{"projectId": project, "types": types}})
	if err := write(ctx, conn, wireMessage{ID: "1", Type: "subscribe", Payload: payload}); err != nil {
		return fail(err)
	}
	f.mu.Lock()
	f.conns = append(f.conns, conn)
	f.mu.Unlock()
	f.open.Add(1)
	f.wg.Go(func() { f.read(readCtx, conn) })
	return nil
}

func write(ctx context.Context, conn *websocket.Conn, m wireMessage) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return conn.Write(ctx, websocket.MessageText, b)
}

var (
	typeNext  = []byte(`"type":"next"`)
	keySentAt = []byte(`"sentAt":`)
	keyTime   = []byte(`"timestamp":"`)
)

func (f *fleet) read(ctx context.Context, conn *websocket.Conn) {
	defer f.open.Add(-1)
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			if ctx.Err() == nil {
				f.ended(err)
			}
			return
		}
		now := time.Now()
		if !bytes.Contains(data, typeNext) {
			var m wireMessage
			if json.Unmarshal(data, &m) == nil && (m.Type == "error" || m.Type == "complete") {
				f.ended(fmt.Errorf("operation %s: %.200s", m.Type, m.Payload))
			}
			continue
		}
		if !f.measuring.Load() {
			continue
		}
		f.received.Add(1)
		if sent, ok := numberAfter(data, keySentAt); ok {
			f.fromCall.record(now.Sub(time.Unix(0, sent)))
			if f.rec != nil {
				f.rec.Observe(1, now.Sub(time.Unix(0, sent)))
			}
		}
		if i := bytes.Index(data, keyTime); i >= 0 {
			rest := data[i+len(keyTime):]
			if j := bytes.IndexByte(rest, '"'); j > 0 {
				if ts, err := time.Parse(time.RFC3339Nano, string(rest[:j])); err == nil {
					f.fromEvent.record(now.Sub(ts))
				}
			}
		}
	}
}

func numberAfter(data, key []byte) (int64, bool) {
	i := bytes.Index(data, key)
	if i < 0 {
		return 0, false
	}
	rest := bytes.TrimLeft(data[i+len(key):], " ")
	j := 0
	for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
		j++
	}
	n, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	return n, err == nil
}

// ended records how a connection or its operation ended before the run did.
func (f *fleet) ended(err error) {
	what := err.Error()
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		what = fmt.Sprintf("close %d %s", ce.Code, ce.Reason)
	} else if len(what) > 60 {
		what = what[:60]
	}
	f.mu.Lock()
	f.closes[what]++
	f.mu.Unlock()
}

// close closes every connection (1000), concurrency at a time, and waits for the readers.
func (f *fleet) close(concurrency int) {
	f.mu.Lock()
	conns := f.conns
	f.mu.Unlock()
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	for _, c := range conns {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_ = c.Close(websocket.StatusNormalClosure, "")
		})
	}
	wg.Wait()
	f.wg.Wait()
}
