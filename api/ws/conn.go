package ws

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	gqlerrors "github.com/graph-gophers/graphql-go/errors"
	"golang.org/x/sync/semaphore"
)

// protocol is what differs between the two wire protocols: how client messages are handled
// and how operation results are framed.
type protocol struct {
	name string
	// handle processes one client message on the reader goroutine.
	handle func(c *conn, data []byte)
	// next frames one execution result.
	next func(id string, r *Response) []byte
	// requestError frames the errors of an operation that never ran; nothing follows it.
	requestError func(id string, errs []*gqlerrors.QueryError) []byte
	// complete frames the end of an operation's results.
	complete func(id string) []byte
	// keepAlive, if set, is sent after connection_ack and then every KeepAlive.
	keepAlive []byte
	// internalErrorCode closes a socket the server failed.
	internalErrorCode websocket.StatusCode
}

// closeMode says how the writer ends a failed connection.
type closeMode int

const (
	// closeHandshake drops queued messages and sends the close frame at once.
	closeHandshake closeMode = iota
	// closeAfterFlush writes what is queued (e.g. legacy connection_error) first.
	closeAfterFlush
	// closeNow drops the TCP connection without a close frame (dead or broken peer).
	closeNow
)

// outbound is one queued message. Messages of an operation the client has stopped are
// dropped by the writer; op is nil for connection-level messages.
type outbound struct {
	op     *operation
	data   []byte
	weight int64 // of the send queue's room (queueRoom)
}

// operation is one running subscribe (legacy start).
type operation struct {
	id     string
	cancel context.CancelFunc
	// stopped is set when the client stops the operation (or a legacy start replaces it):
	// none of its messages may be written after that.
	stopped atomic.Bool
	// started is closed once Executor.Execute has returned: a subscription is then held by
	// the executor, and events from then on reach it.
	started chan struct{}
}

var errConnClosing = errors.New("ws: connection closing")

// conn is one accepted socket. Its reader runs serve on a goroutine of its own; serve starts and
// waits for the writer, the timed duties and the operations.
type conn struct {
	h  *Handler
	ws *websocket.Conn
	// req is the upgrade request until connection_init takes it (takeRequest): only
	// Authenticate reads it, once, and the socket need not keep it.
	req        *http.Request
	remoteAddr string
	proto      *protocol

	// ctx is cancelled when the connection starts closing; operations derive from it.
	ctx    context.Context
	cancel context.CancelFunc

	// queueRoom is the send queue's room, in bytes: a message weighs its length, at least
	// QueueBytes/SubscriberBuffer and at most QueueBytes, so the queue holds at most
	// SubscriberBuffer messages and QueueBytes bytes with one count. The messages themselves wait
	// in queued (writerMu): a socket with nothing to send holds no buffer for them.
	queueRoom *semaphore.Weighted

	closeOnce   sync.Once
	closing     chan struct{} // closed by fail; closeCode, closeReason, closeMode are set before
	closeCode   websocket.StatusCode
	closeReason string
	closeMode   closeMode

	acked atomic.Bool // connection_ack sent: operations allowed

	// Reader-goroutine state.
	initSeen      bool
	owner         owner // the credential and organization the socket counts against (Owner); set before the ack
	authCtx       context.Context
	stopAuthWatch func() bool // unregisters the expiry watch on authCtx

	mu  sync.Mutex // guards ops and pongsOwed
	ops map[string]*operation
	// pongsOwed counts pings not yet answered because operations started before them have not
	// started yet (pong); while it is not zero, one goroutine waits to answer them.
	pongsOwed int

	opsWG sync.WaitGroup // operation goroutines
	bgWG  sync.WaitGroup // the writer, and the goroutine answering owed pings

	// The writer runs only while there is something to write or the close to perform
	// (wakeWriter): writerUp while it runs, writerDone once it has closed the socket.
	writerMu   sync.Mutex
	queued     []outbound
	writerUp   bool
	writerDone bool

	// The timed duties (keep): their timers, whether they are stopped for good, and the duties
	// under way.
	keepMu      sync.Mutex
	keepTimers  []*time.Timer
	keepStopped bool
	keepWG      sync.WaitGroup
}

func newConn(h *Handler, wsc *websocket.Conn, r *http.Request, proto *protocol) *conn {
	// The socket outlives ServeHTTP, whose return ends r's context: its values are kept.
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	return &conn{
		h:          h,
		ws:         wsc,
		req:        r,
		remoteAddr: r.RemoteAddr,
		proto:      proto,
		ctx:        ctx,
		cancel:     cancel,
		queueRoom:  semaphore.NewWeighted(h.cfg.QueueBytes),
		closing:    make(chan struct{}),
		ops:        make(map[string]*operation),
	}
}

// serve runs the connection to its end and returns only when every goroutine it started has.
func (c *conn) serve() {
	c.h.metrics.connOpened(c.proto.name)
	defer c.h.metrics.connClosed(c.proto.name)
	c.debug("ws: socket opened")

	c.keep()

	c.readLoop()

	// The reader has stopped: nothing can start an operation any more.
	c.fail(websocket.StatusNormalClosure, "", closeHandshake)
	if c.stopAuthWatch != nil {
		// authCtx need not derive from c.ctx; do not leave a callback registered on it.
		c.stopAuthWatch()
	}
	c.mu.Lock()
	for id, op := range c.ops {
		op.stopped.Store(true)
		op.cancel()
		delete(c.ops, id)
	}
	c.mu.Unlock()
	c.opsWG.Wait()
	c.stopKeeping()
	c.bgWG.Wait()
	c.h.counts.closeSocket(c.owner)
	c.debug("ws: socket closed", "close_code", int(c.closeCode), "close_reason", c.closeReason)
}

// takeRequest returns the upgrade request for connection_init, which both protocols accept
// once; the reader goroutine's.
func (c *conn) takeRequest() *http.Request {
	r := c.req
	c.req = nil
	return r
}

// logger is the connection's logger, made when there is something to log.
func (c *conn) logger() *slog.Logger {
	return c.h.log.With("remote_addr", c.remoteAddr, "protocol", c.proto.name)
}

// debug logs at debug level, making the logger only when that level is on.
func (c *conn) debug(msg string, args ...any) {
	if c.h.log.Enabled(context.Background(), slog.LevelDebug) {
		c.logger().Debug(msg, args...)
	}
}

// fail starts closing the connection with code and reason; the first call wins. It cancels
// every operation and hands the close to the writer. It reports whether this call was first;
// the first call runs before, if given, before anything closes.
func (c *conn) fail(code websocket.StatusCode, reason string, mode closeMode, before ...func()) bool {
	first := false
	c.closeOnce.Do(func() {
		first = true
		for _, f := range before {
			f()
		}
		c.closeCode, c.closeReason, c.closeMode = code, closeReason(reason), mode
		c.cancel()
		close(c.closing)
		c.stopTimers()
		if mode == closeNow {
			// The writer may be stuck in a write to this peer; this unblocks it.
			_ = c.ws.CloseNow()
		}
		c.wakeWriter()
	})
	return first
}

func (c *conn) readLoop() {
	for {
		if c.ctx.Err() != nil {
			return
		}
		// Not c.ctx: cancelling a read context tears the socket down before the writer can
		// send the close frame. The read ends when the socket closes.
		_, data, err := c.ws.Read(context.Background())
		if err != nil {
			switch {
			case errors.Is(err, websocket.ErrMessageTooBig):
				// The library has sent the 1009 close frame; the writer completes the handshake.
				c.logger().Info("ws: message too big", "limit_bytes", c.h.cfg.MaxMessageBytes)
				c.fail(websocket.StatusMessageTooBig, "message too big", closeHandshake)
			case websocket.CloseStatus(err) != -1:
				c.fail(websocket.CloseStatus(err), "closed by client", closeHandshake)
			default:
				c.debug("ws: read failed", "error", err)
				c.fail(websocket.StatusGoingAway, "read failed", closeNow)
			}
			return
		}
		c.handle(data)
	}
}

// handle runs the protocol on one message; a panic in it (or in Authenticate) closes this
// socket with the protocol's internal-error code instead of leaving it half-served.
func (c *conn) handle(data []byte) {
	defer func() {
		if v := recover(); v != nil {
			c.logger().Error("ws: panic handling message", "panic", v)
			c.fail(c.proto.internalErrorCode, "Internal server error", closeHandshake)
		}
	}()
	c.proto.handle(c, data)
}

// send queues a connection-level message; see enqueue.
func (c *conn) send(op *operation, data []byte) error { return c.enqueue(c.ctx, op, data) }

// enqueue queues a message. When the queue is full, in messages or in bytes, it waits up to
// SlowConsumerTimeout for room and then closes the connection as a slow consumer. It gives up
// when ctx ends: the operation's context for its own messages (a stopped operation stops
// waiting), the connection's otherwise.
func (c *conn) enqueue(ctx context.Context, op *operation, data []byte) error {
	if ctx.Err() != nil {
		return errConnClosing
	}
	m := outbound{op: op, data: data, weight: c.weigh(data)}
	if c.queueRoom.TryAcquire(m.weight) {
		c.push(m)
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, c.h.cfg.SlowConsumerTimeout)
	defer cancel()
	if c.queueRoom.Acquire(wctx, m.weight) == nil {
		c.push(m)
		return nil
	}
	if ctx.Err() == nil {
		c.slow("send queue full", "queue_capacity", c.h.cfg.SubscriberBuffer, "queue_bytes", c.h.cfg.QueueBytes,
			"message_bytes", len(data), "wait", c.h.cfg.SlowConsumerTimeout)
	}
	return errConnClosing
}

// weigh is what data takes of the send queue's room (queueRoom).
func (c *conn) weigh(data []byte) int64 {
	least := max(c.h.cfg.QueueBytes/int64(max(c.h.cfg.SubscriberBuffer, 1)), 1)
	return min(max(int64(len(data)), least), c.h.cfg.QueueBytes)
}

// push queues m, whose room is taken, and wakes the writer.
func (c *conn) push(m outbound) {
	c.writerMu.Lock()
	c.queued = append(c.queued, m)
	c.writerMu.Unlock()
	c.wakeWriter()
}

// pop takes the first message queued, if any.
func (c *conn) pop() (outbound, bool) {
	c.writerMu.Lock()
	defer c.writerMu.Unlock()
	if len(c.queued) == 0 {
		return outbound{}, false
	}
	m := c.queued[0]
	c.queued[0] = outbound{}
	c.queued = c.queued[1:]
	if len(c.queued) == 0 {
		c.queued = nil // a burst's room is let go
	}
	return m, true
}

// slow closes the connection with 4008 "Subscriber too slow"; why and attrs are logged.
func (c *conn) slow(why string, attrs ...any) {
	// Counted before the close is set in motion: a peer that sees the close may look for it.
	if c.fail(CloseSlowConsumer, "Subscriber too slow", closeHandshake, c.h.metrics.slowConsumerClosed) {
		c.logger().Warn("ws: closing slow consumer", append([]any{"reason", why}, attrs...)...)
	}
}

// wakeWriter starts the writer unless it runs or has closed the socket. A subscriber between
// messages holds no writer goroutine, which with the reader's is most of what an idle socket
// costs; a burst of messages is written by the one writer it wakes.
func (c *conn) wakeWriter() {
	c.writerMu.Lock()
	defer c.writerMu.Unlock()
	if c.writerUp || c.writerDone {
		return
	}
	c.writerUp = true
	c.bgWG.Go(c.writeLoop)
}

// writeLoop is the only writer of data frames, and performs the close. It returns once the queue
// is empty; whoever queues next (or fail) starts it again.
func (c *conn) writeLoop() {
	for {
		// Closing takes precedence over whatever is still queued.
		select {
		case <-c.closing:
			c.finish()
			c.writerMu.Lock()
			c.writerUp, c.writerDone = false, true
			c.writerMu.Unlock()
			return
		default:
		}
		if m, ok := c.pop(); ok {
			c.write(m)
			continue
		}
		// Nothing queued: end, unless a message or the close came in meanwhile (whoever queued
		// it saw the writer up and left it to this one).
		c.writerMu.Lock()
		select {
		case <-c.closing:
		default:
			if len(c.queued) == 0 {
				c.writerUp = false
				c.writerMu.Unlock()
				return
			}
		}
		c.writerMu.Unlock()
	}
}

func (c *conn) write(m outbound) {
	defer c.queueRoom.Release(m.weight)
	if m.op != nil && m.op.stopped.Load() {
		return
	}
	// Not derived from c.ctx: a cancelled write context tears the socket down.
	ctx, cancel := context.WithTimeout(context.Background(), c.h.cfg.WriteTimeout)
	err := c.ws.Write(ctx, websocket.MessageText, m.data)
	cancel()
	if err != nil {
		if c.fail(websocket.StatusGoingAway, "write failed", closeNow) {
			c.logger().Info("ws: write failed, dropping socket", "error", err)
		}
		return
	}
	c.h.metrics.messageSent(c.proto.name)
}

// finish ends the socket as fail asked.
func (c *conn) finish() {
	switch c.closeMode {
	case closeNow:
		_ = c.ws.CloseNow()
		return
	case closeAfterFlush:
		for m, ok := c.pop(); ok; m, ok = c.pop() {
			c.write(m)
		}
	}
	// Close writes the close frame (5 s limit) and waits for the peer's (5 s), then drops
	// the TCP connection, which also ends the reader.
	if err := c.ws.Close(c.closeCode, c.closeReason); err != nil {
		c.debug("ws: close handshake incomplete", "error", err)
	}
}

// keep arms the socket's timed duties: InitTimeout, the keep-alive (the protocol's message and a
// WebSocket ping) every KeepAlive and, with a Rechecker, the credential's re-check every
// RecheckInterval. They run on timers, not on a goroutine of the socket's own: a socket between
// duties holds no stack, which is most of what an idle subscriber costs. A duty runs on its
// timer's goroutine for as long as it takes (a ping waits for its pong) and arms its timer
// again when it is done, so duties of one kind never overlap; duties of different kinds run
// independently (a recheck is not held up by a slow pong). The timers stop when the connection
// starts closing; stopKeeping also waits for a duty under way.
func (c *conn) keep() {
	c.after(c.h.cfg.InitTimeout, func() bool {
		if !c.acked.Load() {
			c.logger().Info("ws: no connection_init in time", "init_timeout", c.h.cfg.InitTimeout)
			c.fail(CloseInitTimeout, "Connection initialisation timeout", closeHandshake)
		}
		return false
	})
	c.after(c.h.cfg.KeepAlive, c.keepAlive)
	if rc, ok := c.h.exec.(Rechecker); ok {
		c.after(c.h.cfg.RecheckInterval, func() bool {
			// acked is stored after authCtx is set: once it reads true, authCtx is safe to read.
			return !c.acked.Load() || c.recheck(rc)
		})
	}
}

// keepAlive sends the protocol's keep-alive message, if it has one, once the socket is
// acknowledged, and pings; it reports whether the socket stays open.
func (c *conn) keepAlive() bool {
	if c.proto.keepAlive != nil && c.acked.Load() {
		if c.send(nil, c.proto.keepAlive) != nil {
			return false
		}
	}
	// Not derived from c.ctx: see write. Ping waits for the pong the reader receives.
	ctx, cancel := context.WithTimeout(context.Background(), c.h.cfg.KeepAlive)
	err := c.ws.Ping(ctx)
	cancel()
	if err != nil && c.ctx.Err() == nil {
		if c.fail(websocket.StatusGoingAway, "keep-alive timeout", closeNow) {
			c.logger().Info("ws: peer did not answer ping, dropping socket", "error", err)
		}
		return false
	}
	return c.ctx.Err() == nil
}

// after runs duty d after the socket is accepted, and again d after each run that returns true,
// until the connection starts closing.
func (c *conn) after(d time.Duration, duty func() bool) {
	c.keepMu.Lock()
	defer c.keepMu.Unlock()
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		c.keepMu.Lock()
		if c.keepStopped || c.ctx.Err() != nil {
			c.keepMu.Unlock()
			return
		}
		c.keepWG.Add(1)
		c.keepMu.Unlock()
		defer c.keepWG.Done()
		if !duty() {
			return
		}
		c.keepMu.Lock()
		if !c.keepStopped && c.ctx.Err() == nil {
			t.Reset(d)
		}
		c.keepMu.Unlock()
	})
	c.keepTimers = append(c.keepTimers, t)
}

// stopTimers stops the timers of keep; fail calls it as the connection starts closing (a duty
// that runs meanwhile finds c.ctx ended and does nothing).
func (c *conn) stopTimers() {
	c.keepMu.Lock()
	defer c.keepMu.Unlock()
	for _, t := range c.keepTimers {
		t.Stop()
	}
}

// stopKeeping stops the timers of keep and waits for a duty under way; nothing of keep runs
// after it returns.
func (c *conn) stopKeeping() {
	c.keepMu.Lock()
	c.keepStopped = true
	c.keepMu.Unlock()
	c.stopTimers()
	c.keepWG.Wait()
}

// authenticated records the identity context of a successful connection_init. When that
// context ends before the socket does (a credential that carries an expiry, e.g. a JWT's exp
// as the context deadline), the socket is closed with 4403 and the client must reconnect
// with a fresh credential; operations never outlive the credential they run under.
func (c *conn) authenticated(ctx context.Context) {
	c.authCtx = ctx
	c.acked.Store(true)
	c.stopAuthWatch = context.AfterFunc(ctx, func() {
		if c.ctx.Err() == nil && c.fail(CloseForbidden, "Forbidden: credential expired", closeHandshake) {
			c.logger().Info("ws: credential expired, closing socket")
		}
	})
}

// admit counts the socket, authenticated as ctx, against its credential's SocketsPerKey and
// its organization's SocketsPerOrg. It reports false when either holds as many sockets
// already; the protocol then refuses the socket (4013).
func (c *conn) admit(ctx context.Context) bool {
	o, ok := c.h.exec.(Owner)
	if !ok {
		return true
	}
	var who owner
	who.key, who.org = o.Owner(ctx)
	if !c.h.counts.openSocket(who) {
		c.h.metrics.socketRefused()
		c.logger().Info("ws: too many sockets for the credential or its organization",
			"key_limit", c.h.cfg.SocketsPerKey, "org_limit", c.h.cfg.SocketsPerOrg)
		return false
	}
	c.owner = who
	return true
}

// tooManySockets is the close reason of a socket admit refused.
const tooManySockets = "Too many sockets for this credential"

// forbidden is the close reason of a refused connection_init. It says whether a credential was
// sent, so a client that put its key in the wrong place can tell, and nothing about the
// credential itself.
func forbidden(authorization string) string {
	if authorization == "" {
		return `Forbidden: connection_init payload has no "Authorization"`
	}
	return "Forbidden: invalid API key or token"
}

// recheck asks rc whether the socket's credential still stands and closes the socket with 4403
// when it does not. It reports whether the socket stays open.
func (c *conn) recheck(rc Rechecker) bool {
	// No timeout of its own: a context with a deadline is a timer made and stopped per socket
	// per second, which was most of a recheck's cost (Rechecker bounds its slow paths).
	err := rc.Recheck(c.authCtx)
	if err == nil || c.ctx.Err() != nil {
		return c.ctx.Err() == nil
	}
	if c.fail(CloseForbidden, "Forbidden: credential no longer valid", closeHandshake) {
		c.h.metrics.credentialWithdrawn()
		c.logger().Info("ws: credential no longer valid, closing socket", "error", err)
	}
	return false
}

// startOperation registers and starts op id under the authenticated context. It starts
// nothing when id is active (duplicate), or when the connection, the credential or the node is
// at its limit of operations (refused: the error to send for id).
func (c *conn) startOperation(id string, req Request) (refused *gqlerrors.QueryError, duplicate bool) {
	c.mu.Lock()
	if _, ok := c.ops[id]; ok {
		c.mu.Unlock()
		return nil, true
	}
	if len(c.ops) >= c.h.cfg.MaxOperationsPerConn {
		c.mu.Unlock()
		return tooManyOperations("on this connection", "connection", c.h.cfg.MaxOperationsPerConn), false
	}
	if refused := c.h.counts.startOperation(c.owner); refused != nil {
		c.mu.Unlock()
		c.h.metrics.operationRefused()
		return refused, false
	}
	ctx, cancel := context.WithCancel(context.WithValue(c.authCtx, connKey{}, c))
	// Authenticate should return a context derived from c.ctx; this holds even if it did not.
	stop := context.AfterFunc(c.ctx, cancel)
	op := &operation{id: id, cancel: func() { stop(); cancel() }, started: make(chan struct{})}
	c.ops[id] = op
	c.opsWG.Add(1)
	c.mu.Unlock()

	c.h.metrics.operationStarted(c.proto.name)
	go c.runOperation(ctx, op, req)
	return nil, false
}

// pong answers a ping with msg once every operation started before the ping has started
// (Execute returned), without holding up the reader: a client that pings after a subscribe
// knows from the pong that the subscription receives the events from then on. Pings that
// arrive while some are owed wait for the same goroutine, so a client's pings cost one.
func (c *conn) pong(msg []byte) {
	c.mu.Lock()
	c.pongsOwed++
	if c.pongsOwed > 1 {
		c.mu.Unlock()
		return
	}
	pending := c.unstarted()
	if len(pending) == 0 {
		c.pongsOwed = 0
		c.mu.Unlock()
		_ = c.send(nil, msg)
		return
	}
	c.mu.Unlock()
	c.bgWG.Go(func() {
		for {
			for _, ch := range pending {
				select {
				case <-ch:
				case <-c.ctx.Done():
					return
				}
			}
			c.mu.Lock()
			if pending = c.unstarted(); len(pending) == 0 {
				n := c.pongsOwed
				c.pongsOwed = 0
				c.mu.Unlock()
				for range n {
					if c.send(nil, msg) != nil {
						return
					}
				}
				return
			}
			c.mu.Unlock()
		}
	})
}

// unstarted returns the started channels of the operations still in Execute; the caller holds
// mu.
func (c *conn) unstarted() []chan struct{} {
	var pending []chan struct{}
	for _, op := range c.ops {
		select {
		case <-op.started:
		default:
			pending = append(pending, op.started)
		}
	}
	return pending
}

// stopOperation stops op id at the client's request. Its queued and future messages are
// dropped. It reports whether id was active.
func (c *conn) stopOperation(id string) bool {
	c.mu.Lock()
	op, ok := c.ops[id]
	if ok {
		delete(c.ops, id)
	}
	c.mu.Unlock()
	if ok {
		op.stopped.Store(true)
		op.cancel()
	}
	return ok
}

// release unregisters op when it ends by itself, before its last message is queued so that
// a client reusing the id after that message is never taken for a duplicate. It reports
// false when the client had stopped op already: then nothing more may be sent for it.
func (c *conn) release(op *operation) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ops[op.id] != op {
		return false
	}
	delete(c.ops, op.id)
	return true
}

// drainTimeout bounds the wait for an executor's goroutines after cancellation (Results.Close).
const drainTimeout = 5 * time.Second

func (c *conn) drain(op *operation, results Results) {
	op.cancel()
	if !results.Close(drainTimeout) {
		c.logger().Error("ws: executor's operation did not end after cancellation", "op_id", op.id, "waited", drainTimeout)
	}
}

func (c *conn) runOperation(ctx context.Context, op *operation, req Request) {
	ended := true
	defer func() {
		if ended {
			c.endOperation(op, nil, nil)
		}
	}()
	defer c.recoverOperation(ctx, op)

	results, err := func() (Results, error) {
		defer close(op.started)
		return c.h.exec.Execute(ctx, req)
	}()
	if err != nil {
		var qe *gqlerrors.QueryError
		if !errors.As(err, &qe) {
			c.logger().Error("ws: execute failed", "op_id", op.id, "error", err)
			qe = internalError()
		}
		if c.release(op) {
			_ = c.enqueue(ctx, op, c.proto.requestError(op.id, []*gqlerrors.QueryError{qe}))
		}
		return
	}

	if n, ok := results.(Notifier); ok {
		ended = false
		// This goroutine runs the first step (p is claimed); a wake meanwhile (the context
		// ended already) has it look again.
		p := &parked{ctx: ctx, op: op, results: results, n: n, first: true, running: true}
		p.stopWatch = context.AfterFunc(ctx, func() { c.wake(p) })
		c.step(p)
		return
	}

	// However the operation ends, wait for the executor's goroutines: they belong to this
	// operation, and this operation to the connection that waits for it.
	defer c.drain(op, results)
	for first := true; ; {
		r, ok := results.Next(ctx)
		if !c.deliver(ctx, op, r, ok, first) {
			return
		}
		if r != nil {
			first = false
		}
	}
}

// recoverOperation, deferred, turns a panic of an operation's code into an internal error for
// the client; the operation then ends.
func (c *conn) recoverOperation(ctx context.Context, op *operation) {
	if v := recover(); v != nil {
		c.logger().Error("ws: panic in operation", "op_id", op.id, "panic", v)
		if c.release(op) {
			_ = c.enqueue(ctx, op, c.proto.requestError(op.id, []*gqlerrors.QueryError{internalError()}))
		}
	}
}

// endOperation is the end of every operation, once: its context, its results (drain), its counts.
func (c *conn) endOperation(op *operation, results Results, stopWatch func() bool) {
	if stopWatch != nil {
		stopWatch()
	}
	if results != nil {
		c.drain(op, results)
	}
	op.cancel()
	c.h.metrics.operationEnded(c.proto.name)
	c.h.counts.endOperation(c.owner)
	c.opsWG.Done()
}

// deliver turns what Next returned into the operation's message; false once the operation is
// over (ended, stopped, refused, or its message could not be queued).
func (c *conn) deliver(ctx context.Context, op *operation, r *Response, ok, first bool) bool {
	switch {
	case ctx.Err() != nil:
		c.release(op)
		return false
	case !ok:
		if c.release(op) {
			_ = c.enqueue(ctx, op, c.proto.complete(op.id))
		}
		return false
	case r == nil:
		return true
	case first && len(r.Data) == 0 && len(r.Errors) > 0:
		if c.release(op) {
			_ = c.enqueue(ctx, op, c.proto.requestError(op.id, r.Errors))
		}
		return false
	}
	if c.enqueue(ctx, op, c.proto.next(op.id, r)) != nil {
		c.release(op)
		return false
	}
	return true
}

// parked is an operation whose results are a Notifier: between responses it holds no goroutine.
// A goroutine runs it (step) when a response is ready or its context ends (wake), one at a time.
type parked struct {
	ctx       context.Context
	op        *operation
	results   Results
	n         Notifier
	first     bool
	stopWatch func() bool // the context's AfterFunc

	mu      sync.Mutex
	running bool // a goroutine runs step
	again   bool // woken while running: look once more before parking
}

// claim reports whether the caller is to run p's step: false when a goroutine runs it already,
// which is then told to look once more before it parks.
func (p *parked) claim() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running {
		p.again = true
		return false
	}
	p.running = true
	return true
}

// park reports whether the step may end here: false when it was woken meanwhile.
func (p *parked) park() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.again {
		p.again = false
		return false
	}
	p.running = false
	return true
}

// wake runs p's step on a goroutine of its own, unless one runs it already.
func (c *conn) wake(p *parked) {
	if p.claim() {
		go c.step(p)
	}
}

// step delivers what is ready, then parks the operation until the results notify (or its
// context ends), or ends it. The caller has claimed p.
func (c *conn) step(p *parked) {
	over := true
	defer func() {
		if over {
			c.endOperation(p.op, p.results, p.stopWatch)
		}
	}()
	defer c.recoverOperation(p.ctx, p.op)
	for {
		for p.n.Ready() || p.ctx.Err() != nil {
			r, ok := p.results.Next(p.ctx)
			if !c.deliver(p.ctx, p.op, r, ok, p.first) {
				return
			}
			if r != nil {
				p.first = false
			}
		}
		// Ask to be woken before letting go: once parked, another goroutine may run the
		// results, and only the one that runs the step may touch them. A notification that
		// comes before park is a look again.
		p.n.Notify(func() { c.wake(p) })
		if p.park() {
			over = false
			return
		}
	}
}
