package ws

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	gqlerrors "github.com/graph-gophers/graphql-go/errors"
)

// message is a client message after the envelope checks both protocols share.
type message struct {
	Type    string
	ID      string
	HasID   bool
	Payload json.RawMessage // nil when absent or JSON null
}

// parseMessage checks the envelope: a JSON object whose "type" is a string and whose "id",
// when present, is a string.
func parseMessage(data []byte) (message, error) {
	var env struct {
		Type    json.RawMessage `json:"type"`
		ID      json.RawMessage `json:"id"`
		Payload json.RawMessage `json:"payload"`
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return message{}, errors.New("message is not a JSON object")
	}
	if err := json.Unmarshal(data, &env); err != nil {
		return message{}, fmt.Errorf("message is not valid JSON: %w", err)
	}
	var m message
	if env.Type == nil || isNull(env.Type) {
		return message{}, errors.New("message is missing the 'type' property")
	}
	if err := json.Unmarshal(env.Type, &m.Type); err != nil {
		return message{}, errors.New("message 'type' property is not a string")
	}
	if env.ID != nil && !isNull(env.ID) {
		if err := json.Unmarshal(env.ID, &m.ID); err != nil {
			return message{}, errors.New("message 'id' property is not a string")
		}
		m.HasID = true
	}
	if env.Payload != nil && !isNull(env.Payload) {
		m.Payload = env.Payload
	}
	return m, nil
}

func isNull(raw json.RawMessage) bool {
	return bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

func isObject(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{'
}

// parseRequest decodes a subscribe (legacy start) payload: query a string, operationName a
// string or null, variables and extensions objects or null.
func parseRequest(payload json.RawMessage) (Request, error) {
	if !isObject(payload) {
		return Request{}, errors.New("payload must be an object")
	}
	var p struct {
		Query         json.RawMessage `json:"query"`
		OperationName json.RawMessage `json:"operationName"`
		Variables     json.RawMessage `json:"variables"`
		Extensions    json.RawMessage `json:"extensions"`
	}
	if err := json.Unmarshal(payload, &p); err != nil {
		return Request{}, fmt.Errorf("payload: %w", err)
	}
	var req Request
	if p.Query == nil || json.Unmarshal(p.Query, &req.Query) != nil || req.Query == "" {
		return Request{}, errors.New("payload 'query' must be a non-empty string")
	}
	if p.OperationName != nil && !isNull(p.OperationName) {
		if json.Unmarshal(p.OperationName, &req.OperationName) != nil {
			return Request{}, errors.New("payload 'operationName' must be a string or null")
		}
	}
	if p.Variables != nil && !isNull(p.Variables) {
		if !isObject(p.Variables) || json.Unmarshal(p.Variables, &req.Variables) != nil {
			return Request{}, errors.New("payload 'variables' must be an object or null")
		}
	}
	if p.Extensions != nil && !isNull(p.Extensions) && !isObject(p.Extensions) {
		return Request{}, errors.New("payload 'extensions' must be an object or null")
	}
	return req, nil
}

// initAuthorization returns the credential of a connection_init payload: its "Authorization"
// member, or "authorization" as some clients spell it. ok is false when the payload is
// present but not an object.
func initAuthorization(payload json.RawMessage) (auth string, ok bool) {
	if payload == nil {
		return "", true
	}
	if !isObject(payload) {
		return "", false
	}
	var params map[string]json.RawMessage
	if json.Unmarshal(payload, &params) != nil {
		return "", false
	}
	for _, key := range []string{"Authorization", "authorization"} {
		if raw, found := params[key]; found {
			var s string
			if json.Unmarshal(raw, &s) == nil {
				return s, true
			}
		}
	}
	return "", true
}

// outMessage is a server message; Payload is omitted when nil.
type outMessage struct {
	ID      string `json:"id,omitempty"`
	Type    string `json:"type"`
	Payload any    `json:"payload,omitempty"`
}

// encode marshals a server message. Payloads are built from our own types and
// json.RawMessage produced by the executor; a failure means the executor handed over invalid
// JSON, and the client gets an internal error for that operation instead.
func encode(m outMessage) []byte {
	b, err := json.Marshal(m)
	if err != nil {
		b, _ = json.Marshal(outMessage{ID: m.ID, Type: m.Type, Payload: internalErrorPayload(m.Type)})
	}
	return b
}

// encodeNext marshals a message whose payload is an execution result. The result's data is
// spliced in as it is: the executor builds it from encoded values (graph-gophers concatenates
// what encoding/json wrote), and marshalling it again would scan and copy every byte once more
// for each subscriber an event reaches, the largest cost of a fan-out of large events.
func encodeNext(id, typ string, r *Response) []byte {
	if len(r.Data) == 0 {
		return encode(outMessage{ID: id, Type: typ, Payload: r})
	}
	rest, err := json.Marshal(Response{Errors: r.Errors, Extensions: r.Extensions}) // {…} or {}
	if err != nil {
		return encode(outMessage{ID: id, Type: typ, Payload: internalErrorPayload(typ)})
	}
	out := make([]byte, 0, len(r.Data)+len(rest)+len(id)+64)
	out = append(out, '{')
	if id != "" {
		out = append(out, `"id":`...)
		out = appendString(out, id)
		out = append(out, ',')
	}
	out = append(out, `"type":`...)
	out = appendString(out, typ)
	out = append(out, `,"payload":{"data":`...)
	out = append(out, r.Data...)
	if inner := rest[1 : len(rest)-1]; len(inner) > 0 {
		out = append(out, ',')
		out = append(out, inner...)
	}
	return append(out, '}', '}')
}

// appendString appends s as a JSON string, as encoding/json writes it.
func appendString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s)
	return append(dst, b...)
}

func internalErrorPayload(typ string) any {
	errs := []*gqlerrors.QueryError{internalError()}
	if typ == "error" {
		return errs
	}
	return Response{Errors: errs}
}

func internalError() *gqlerrors.QueryError {
	return &gqlerrors.QueryError{Message: "internal server error", Extensions: map[string]any{"code": "INTERNAL"}}
}

// maxCloseReason is the longest close reason a control frame can carry (125 - 2 bytes).
const maxCloseReason = 123

// closeReason shortens s to fit a close frame without splitting a UTF-8 sequence.
func closeReason(s string) string {
	if len(s) <= maxCloseReason {
		return s
	}
	s = s[:maxCloseReason]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return strings.TrimSpace(s)
}
