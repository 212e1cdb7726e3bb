// Package wsfleet is the client side of carehub's GraphQL subscription load, shared by
// cmd/wsload (a running node) and cmd/peerbench (carehub beside a peer realtime server): a Fleet
// of graphql-transport-ws connections, each with one eventStream subscription, that timestamps
// what it receives; the Publisher that sends events on an absolute schedule and counts what the
// fleet should receive (Plan); the Node client that sets a carehub node up for it; and the
// lock-free latency histogram (Hist) both record into.
package wsfleet

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

// Fleet is the set of subscribed connections. Each connection has one goroutine that reads it
// and timestamps every result; the payload is scanned for the two numbers the report needs
// rather than decoded, so the client spends as little of the machine's CPU as it can. Any
// server that speaks graphql-transport-ws and has carehub's eventStream subscription will do.
type Fleet struct {
	url string
	key string
	hc  *http.Client

	Measuring atomic.Bool // results count only while set
	FromCall  Hist        // publish call start → received (payload.sentAt)
	FromEvent Hist        // event timestamp (createdAt) → received
	Handshake Hist        // dial start → connection_ack
	Received  atomic.Int64
	Open      atomic.Int64
	// Rec, when set before any result arrives, gets every measured result: the progress line
	// and report series.
	Rec *loadreport.Recorder

	mu     sync.Mutex
	conns  []*websocket.Conn
	closes map[string]int // how connections ended before the run did

	wg sync.WaitGroup
}

// New returns an empty fleet of url (ws://…/graphql) whose connections authenticate with key
// (connection_init {"Authorization": "Bearer key"}).
func New(url, key string) *Fleet {
	return &Fleet{url: url, key: key, closes: map[string]int{},
		hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: -1}}}
}

type wireMessage struct {
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Connect opens one connection, authenticates and subscribes to eventStream(project, types)
// within ctx; its reader runs until readCtx ends or the server closes it.
func (f *Fleet) Connect(ctx, readCtx context.Context, project string, types []string) error {
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
	f.Handshake.Record(time.Since(start))
	payload, _ := json.Marshal(map[string]any{"query": eventStreamQuery, "variables": map[string]any{"projectId": project, "types": types}})
	if err := write(ctx, conn, wireMessage{ID: "1", Type: "subscribe", Payload: payload}); err != nil {
		return fail(err)
	}
	f.mu.Lock()
	f.conns = append(f.conns, conn)
	f.mu.Unlock()
	f.Open.Add(1)
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

func (f *Fleet) read(ctx context.Context, conn *websocket.Conn) {
	defer f.Open.Add(-1)
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
		if !f.Measuring.Load() {
			continue
		}
		f.Received.Add(1)
		if sent, ok := numberAfter(data, keySentAt); ok {
			f.FromCall.Record(now.Sub(time.Unix(0, sent)))
			if f.Rec != nil {
				f.Rec.Observe(1, now.Sub(time.Unix(0, sent)))
			}
		}
		if i := bytes.Index(data, keyTime); i >= 0 {
			rest := data[i+len(keyTime):]
			if j := bytes.IndexByte(rest, '"'); j > 0 {
				if ts, err := time.Parse(time.RFC3339Nano, string(rest[:j])); err == nil {
					f.FromEvent.Record(now.Sub(ts))
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
func (f *Fleet) ended(err error) {
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

// Reset empties the counts and histograms of what was received (not Handshake), leaving the
// fleet measuring; call it while nothing is being published.
func (f *Fleet) Reset() {
	f.Measuring.Store(false)
	f.FromCall.Reset()
	f.FromEvent.Reset()
	f.Received.Store(0)
	f.Measuring.Store(true)
}

// Ended returns how connections or their operations ended before the run did: close codes and
// reasons, "operation error"/"operation complete", read errors; a count of each.
func (f *Fleet) Ended() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.closes))
	for k, v := range f.closes {
		out[k] = v
	}
	return out
}

// Close closes every connection (1000), concurrency at a time, and waits for the readers.
// Connections are forgotten: the fleet may connect anew afterwards.
func (f *Fleet) Close(concurrency int) {
	f.mu.Lock()
	conns := f.conns
	f.conns = nil
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
