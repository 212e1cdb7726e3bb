// Package events defines carehub's platform events: the envelope (Event), the catalogue of
// event types (DECISIONS §4), the type and pattern syntax, and Append, which writes events to the
// transactional outbox (carehub/ingest/outbox) inside the caller's Postgres transaction.
//
// An event exists exactly when the change that caused it commits: a service calls Append in the
// same transaction as its entity write, and the outbox relay (ingest/outbox) publishes the rows to
// Kafka after commit. Consumers receive each event at least once and deduplicate by event id.
package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"carehub/kernel/ids"
	"carehub/kernel/jsonwire"
)

// Sources an event may carry (the REST Event's source enumeration).
const (
	SourceWorkflow    = "workflow"
	SourceAgent       = "agent"
	SourceIntegration = "integration"
	SourceDeployment  = "deployment"
	SourceSystem      = "system"
)

// Severities an event may carry.
const (
	SeverityInfo     = "info"
	SeverityWarning  = "warning"
	SeverityError    = "error"
	SeverityCritical = "critical"
)

// Errors returned by New and Validate.
var (
	ErrInvalidType     = errors.New("invalid event type")
	ErrInvalidSource   = errors.New("invalid event source")
	ErrInvalidSeverity = errors.New("invalid event severity")
	ErrInvalidEnvelope = errors.New("invalid event envelope")
)

// ValidSource reports whether s is one of the event sources.
func ValidSource(s string) bool {
	switch s {
	case SourceWorkflow, SourceAgent, SourceIntegration, SourceDeployment, SourceSystem:
		return true
	}
	return false
}

// ValidSeverity reports whether s is one of the event severities.
func ValidSeverity(s string) bool {
	switch s {
	case SeverityInfo, SeverityWarning, SeverityError, SeverityCritical:
		return true
	}
	return false
}

// ValidType reports whether typ is two or more dot-separated segments of [a-z0-9_].
func ValidType(typ string) bool {
	if typ == "" || len(typ) > 255 {
		return false
	}
	segments := 1
	start := 0
	for i := 0; i < len(typ); i++ {
		c := typ[i]
		switch {
		case c == '.':
			if i == start {
				return false // empty segment
			}
			segments++
			start = i + 1
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_':
		default:
			return false
		}
	}
	return start < len(typ) && segments >= 2
}

// ValidPattern reports whether p is a subscription pattern: an exact type, "prefix.*" where
// prefix is one or more segments, or "*".
func ValidPattern(p string) bool {
	if p == "*" {
		return true
	}
	if prefix, ok := strings.CutSuffix(p, ".*"); ok {
		return validSegments(prefix)
	}
	return ValidType(p)
}

// validSegments reports whether s is one or more dot-separated segments of [a-z0-9_].
func validSegments(s string) bool {
	return ValidType(s + ".x")
}

// MatchPattern reports whether the event type typ matches pattern: an exact match, "*" for any
// type, or "prefix.*" for any type that starts with "prefix." (so "agent.*" matches
// "agent.run.failed" and "agent.run_completed" but not "agent" or "agents.x"). An invalid
// pattern matches nothing.
func MatchPattern(pattern, typ string) bool {
	if pattern == "*" {
		return ValidType(typ)
	}
	if prefix, ok := strings.CutSuffix(pattern, ".*"); ok {
		return validSegments(prefix) && strings.HasPrefix(typ, prefix+".") && ValidType(typ)
	}
	return pattern == typ && ValidType(typ)
}

// MatchAny reports whether typ matches at least one of patterns.
func MatchAny(patterns []string, typ string) bool {
	for _, p := range patterns {
		if MatchPattern(p, typ) {
			return true
		}
	}
	return false
}

// New makes an event with a new evt_ id, created now. createdAt is UTC truncated to microseconds,
// the precision of Postgres timestamptz and of the event log, so the envelope round-trips
// exactly. payload is marshalled to JSON unless it already is JSON (json.RawMessage or []byte);
// a nil payload becomes {}.
func New(typ, orgID, projectID, source, severity string, payload any) (Event, error) {
	raw, err := marshalPayload(payload)
	if err != nil {
		return Event{}, fmt.Errorf("new event %s: %w", typ, err)
	}
	ev := Event{
		ID:        ids.New(ids.Event),
		Type:      typ,
		OrgID:     orgID,
		ProjectID: projectID,
		Source:    source,
		Severity:  severity,
		Payload:   raw,
		CreatedAt: Now(),
	}
	if err := Validate(ev); err != nil {
		return Event{}, fmt.Errorf("new event: %w", err)
	}
	return ev, nil
}

// Now returns the current time as events carry it: UTC, truncated to microseconds.
func Now() time.Time {
	return time.Now().UTC().Truncate(time.Microsecond)
}

func marshalPayload(payload any) (json.RawMessage, error) {
	switch p := payload.(type) {
	case nil:
		return json.RawMessage(`{}`), nil
	case json.RawMessage: // New's Validate checks it
		return p, nil
	case []byte:
		return json.RawMessage(p), nil
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("marshal payload: %w", err)
	}
	return raw, nil
}

// Validate checks an envelope as it is published: an evt_ id, a valid type, a known source and
// severity, a creation time, and a payload that is a JSON object the event log's stores can
// hold (jsonwire.Storable: an event they refuse would stop the log's writer on it). OrgID and
// ProjectID are not checked: marketplace events (asset.submitted, asset.approved, …) belong to
// no project, and the event log simply files them under the empty project.
func Validate(ev Event) error {
	if err := validateFields(ev); err != nil {
		return err
	}
	if p := bytes.TrimLeft(ev.Payload, " \t\r\n"); len(p) == 0 || p[0] != '{' {
		return errPayload
	}
	if err := jsonwire.Storable(ev.Payload); err != nil {
		if errors.Is(err, jsonwire.ErrInvalidJSON) {
			return errPayload
		}
		return fmt.Errorf("%w: payload: %w", ErrInvalidEnvelope, err)
	}
	return nil
}

var errPayload = fmt.Errorf("%w: payload must be a JSON object", ErrInvalidEnvelope)

// validateFields is Validate but for the payload.
func validateFields(ev Event) error {
	switch {
	case !ids.Valid(ids.Event, ev.ID):
		return fmt.Errorf("%w: id %q", ErrInvalidEnvelope, ev.ID)
	case !ValidType(ev.Type):
		return fmt.Errorf("%w %q", ErrInvalidType, ev.Type)
	case !ValidSource(ev.Source):
		return fmt.Errorf("%w %q", ErrInvalidSource, ev.Source)
	case !ValidSeverity(ev.Severity):
		return fmt.Errorf("%w %q", ErrInvalidSeverity, ev.Severity)
	case ev.CreatedAt.IsZero():
		return fmt.Errorf("%w: no createdAt", ErrInvalidEnvelope)
	}
	return nil
}
