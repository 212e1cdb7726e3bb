package ws

import (
	"fmt"

	"github.com/coder/websocket"
	gqlerrors "github.com/graph-gophers/graphql-go/errors"
)

// subscriptions-transport-ws message types (the ones not shared with graphql-transport-ws).
const (
	typeLegacyConnectionError     = "connection_error"
	typeLegacyConnectionTerminate = "connection_terminate"
	typeLegacyKeepAlive           = "ka"
	typeLegacyStart               = "start"
	typeLegacyStop                = "stop"
	typeLegacyData                = "data"
)

// legacyProtocol is subscriptions-transport-ws's graphql-ws (its PROTOCOL.md): message-level
// mistakes are answered with connection_error or error and the socket stays open.
var legacyProtocol = &protocol{
	name:   ProtocolLegacy,
	handle: (*conn).handleLegacy,
	next: func(id string, r *Response) []byte {
		return encodeNext(id, typeLegacyData, r)
	},
	requestError: func(id string, errs []*gqlerrors.QueryError) []byte {
		return encode(outMessage{ID: id, Type: typeError, Payload: legacyErrorPayload(errs)})
	},
	complete: func(id string) []byte {
		return encode(outMessage{ID: id, Type: typeComplete})
	},
	keepAlive: encode(outMessage{Type: typeLegacyKeepAlive}),
	// The reference server closes with 1011 when its onConnect or execution blows up.
	internalErrorCode: websocket.StatusInternalError,
}

var legacyAck = encode(outMessage{Type: typeConnectionAck})

// legacyError is the payload of error and connection_error. PROTOCOL.md makes it one Error
// (message); errors carries all of them, which the reference client unwraps when present.
type legacyError struct {
	Message string                  `json:"message"`
	Errors  []*gqlerrors.QueryError `json:"errors,omitempty"`
}

func legacyErrorPayload(errs []*gqlerrors.QueryError) legacyError {
	p := legacyError{Message: "operation failed", Errors: errs}
	if len(errs) > 0 {
		p.Message = errs[0].Message
	}
	return p
}

func legacyMessageError(id, typ, msg string) []byte {
	return encode(outMessage{ID: id, Type: typ, Payload: legacyError{Message: msg}})
}

func (c *conn) handleLegacy(data []byte) {
	m, err := parseMessage(data)
	if err != nil {
		// PROTOCOL.md: answered with connection_error, the socket stays open.
		_ = c.send(nil, legacyMessageError("", typeLegacyConnectionError, err.Error()))
		return
	}
	switch m.Type {
	case typeConnectionInit:
		if c.initSeen {
			_ = c.send(nil, legacyMessageError("", typeLegacyConnectionError, "Too many initialisation requests"))
			c.fail(CloseTooManyInitRequests, "Too many initialisation requests", closeAfterFlush)
			return
		}
		c.initSeen = true
		// A payload that is not an object carries no credential; Authenticate rejects that.
		auth, _ := initAuthorization(m.Payload)
		ctx, err := c.h.exec.Authenticate(c.ctx, c.takeRequest(), auth)
		if err != nil {
			c.logger().Info("ws: connection_init rejected", "error", err)
			_ = c.send(nil, legacyMessageError("", typeLegacyConnectionError, forbidden(auth)))
			c.fail(CloseForbidden, forbidden(auth), closeAfterFlush)
			return
		}
		if !c.admit(ctx) {
			_ = c.send(nil, legacyMessageError("", typeLegacyConnectionError, tooManySockets))
			c.fail(CloseTooManySockets, tooManySockets, closeAfterFlush)
			return
		}
		c.authenticated(ctx)
		if c.send(nil, legacyAck) == nil {
			_ = c.send(nil, c.proto.keepAlive)
		}

	case typeLegacyStart:
		if !m.HasID || m.ID == "" {
			_ = c.send(nil, legacyMessageError("", typeError, "start message requires a non-empty 'id'"))
			return
		}
		if !c.acked.Load() {
			_ = c.send(nil, legacyMessageError(m.ID, typeError, "Unauthorized: send connection_init first"))
			return
		}
		req, err := parseRequest(m.Payload)
		if err != nil {
			_ = c.send(nil, legacyMessageError(m.ID, typeError, "start "+err.Error()))
			return
		}
		// The reference server replaces an active operation with the same id.
		c.stopOperation(m.ID)
		if refused, _ := c.startOperation(m.ID, req); refused != nil {
			_ = c.send(nil, c.proto.requestError(m.ID, []*gqlerrors.QueryError{refused}))
		}

	case typeLegacyStop:
		// PROTOCOL.md: the server answers a stop with complete.
		if m.HasID && c.stopOperation(m.ID) {
			_ = c.send(nil, c.proto.complete(m.ID))
		}

	case typeLegacyConnectionTerminate:
		c.fail(websocket.StatusNormalClosure, "", closeAfterFlush)

	default:
		_ = c.send(nil, legacyMessageError(m.ID, typeError, fmt.Sprintf("Invalid message type %q", m.Type)))
	}
}
