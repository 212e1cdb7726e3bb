package ws

import (
	"fmt"

	gqlerrors "github.com/graph-gophers/graphql-go/errors"
)

// graphql-transport-ws message types.
const (
	typeConnectionInit = "connection_init"
	typeConnectionAck  = "connection_ack"
	typePing           = "ping"
	typePong           = "pong"
	typeSubscribe      = "subscribe"
	typeNext           = "next"
	typeError          = "error"
	typeComplete       = "complete"
)

// transportProtocol is graphql-transport-ws (enisdenjo/graphql-ws PROTOCOL.md): every
// protocol violation closes the socket with a 44xx code.
var transportProtocol = &protocol{
	name:   ProtocolTransportWS,
	handle: (*conn).handleTransport,
	next: func(id string, r *Response) []byte {
		return encodeNext(id, typeNext, r)
	},
	requestError: func(id string, errs []*gqlerrors.QueryError) []byte {
		return encode(outMessage{ID: id, Type: typeError, Payload: errs})
	},
	complete: func(id string) []byte {
		return encode(outMessage{ID: id, Type: typeComplete})
	},
	internalErrorCode: CloseInternalServerError,
}

var (
	transportAck  = encode(outMessage{Type: typeConnectionAck})
	transportPong = encode(outMessage{Type: typePong})
)

func (c *conn) handleTransport(data []byte) {
	m, err := parseMessage(data)
	if err != nil {
		c.fail(CloseBadRequest, err.Error(), closeHandshake)
		return
	}
	switch m.Type {
	case typeConnectionInit:
		if c.initSeen {
			c.fail(CloseTooManyInitRequests, "Too many initialisation requests", closeHandshake)
			return
		}
		c.initSeen = true
		auth, ok := initAuthorization(m.Payload)
		if !ok {
			c.fail(CloseBadRequest, "connection_init payload must be an object", closeHandshake)
			return
		}
		ctx, err := c.h.exec.Authenticate(c.ctx, c.takeRequest(), auth)
		if err != nil {
			// The error may describe the credential; it is logged, never echoed or the key itself.
			c.logger().Info("ws: connection_init rejected", "error", err)
			c.fail(CloseForbidden, forbidden(auth), closeHandshake)
			return
		}
		if !c.admit(ctx) {
			c.fail(CloseTooManySockets, tooManySockets, closeHandshake)
			return
		}
		c.authenticated(ctx)
		_ = c.send(nil, transportAck)

	case typePing:
		c.pong(transportPong)

	case typePong:
		// An answer to a ping we never send, or a unidirectional heartbeat: nothing to do.

	case typeSubscribe:
		if !m.HasID || m.ID == "" {
			c.fail(CloseBadRequest, "subscribe message requires a non-empty 'id'", closeHandshake)
			return
		}
		req, err := parseRequest(m.Payload)
		if err != nil {
			c.fail(CloseBadRequest, "subscribe "+err.Error(), closeHandshake)
			return
		}
		if !c.acked.Load() {
			c.fail(CloseUnauthorized, "Unauthorized", closeHandshake)
			return
		}
		refused, duplicate := c.startOperation(m.ID, req)
		switch {
		case duplicate:
			c.fail(CloseSubscriberExists, fmt.Sprintf("Subscriber for %s already exists", m.ID), closeHandshake)
		case refused != nil:
			_ = c.send(nil, c.proto.requestError(m.ID, []*gqlerrors.QueryError{refused}))
		}

	case typeComplete:
		if !m.HasID || m.ID == "" {
			c.fail(CloseBadRequest, "complete message requires a non-empty 'id'", closeHandshake)
			return
		}
		// Unknown ids belong to operations already completed: ignored, as the protocol allows.
		c.stopOperation(m.ID)

	default:
		c.fail(CloseBadRequest, fmt.Sprintf("Unexpected message of type %q received", m.Type), closeHandshake)
	}
}
