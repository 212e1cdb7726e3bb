package fhirsubs

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
)

// Notification types (the backport's SubscriptionStatus.type).
const (
	TypeHandshake    = "handshake"
	TypeHeartbeat    = "heartbeat"
	TypeNotification = "event-notification"
)

type param struct {
	Name           string     `json:"name"`
	ValueString    string     `json:"valueString,omitempty"`
	ValueCode      string     `json:"valueCode,omitempty"`
	ValueCanonical string     `json:"valueCanonical,omitempty"`
	ValueInstant   string     `json:"valueInstant,omitempty"`
	ValueReference *reference `json:"valueReference,omitempty"`
	Part           []param    `json:"part,omitempty"`
}

type reference struct {
	Reference string `json:"reference"`
}

// statusParameters is the subscription's SubscriptionStatus (the backport's R4 Parameters
// profile) for a notification of typ carrying evs.
func statusParameters(sub Subscription, base, typ string, evs []event) map[string]any {
	ps := []param{
		{Name: "subscription", ValueReference: &reference{Reference: base + "/Subscription/" + ids.FHIR(sub.ID)}},
		{Name: "topic", ValueCanonical: sub.Topic.URL()},
		{Name: "status", ValueCode: sub.Status},
		{Name: "type", ValueCode: typ},
		{Name: "events-since-subscription-start", ValueString: number(sub.EventsSinceStart)},
	}
	for _, ev := range evs {
		parts := []param{{Name: "event-number", ValueString: number(ev.Number)},
			{Name: "timestamp", ValueInstant: ev.OccurredAt.UTC().Format(time.RFC3339Nano)}}
		if sub.Content != ContentEmpty {
			parts = append(parts, param{Name: "focus", ValueReference: &reference{Reference: base + "/" + ev.FocusType + "/" + ids.FHIR(ev.FocusID)}})
		}
		ps = append(ps, param{Name: "notification-event", Part: parts})
	}
	return map[string]any{"resourceType": "Parameters", "id": newUUID(), "meta": map[string]any{"profile": []string{profStatus}}, "parameter": ps}
}

// bundle is a notification Bundle (type history, the backport's R4 notification profile) of typ
// for sub carrying evs as sub.Content says, with the patients it names: what an audit record of
// its delivery lists. A full-resource entry whose resource cannot be read as the subscription's
// creator (deleted since, or no longer theirs to read) goes as id-only.
func (s *Service) bundle(ctx context.Context, sub Subscription, base, typ string, evs []event) ([]byte, []string, error) {
	status := statusParameters(sub, base, typ, evs)
	entries := []map[string]any{{
		"fullUrl":  "urn:uuid:" + status["id"].(string),
		"resource": status,
		"request":  map[string]string{"method": "GET", "url": base + "/Subscription/" + ids.FHIR(sub.ID) + "/$status"},
		"response": map[string]string{"status": "200"},
	}}
	var patients []string
	if sub.Content != ContentEmpty {
		readCtx := access.With(ctx, sub.principal())
		for _, ev := range evs {
			if !slices.Contains(patients, ev.PatientID) {
				patients = append(patients, ev.PatientID)
			}
			e := map[string]any{
				"fullUrl":  base + "/" + ev.FocusType + "/" + ids.FHIR(ev.FocusID),
				"request":  map[string]string{"method": "POST", "url": ev.FocusType},
				"response": map[string]string{"status": "201"},
			}
			if sub.Content == ContentFull {
				doc, err := s.cfg.Read(readCtx, ev.FocusType, ev.FocusID)
				switch k := fault.KindOf(err); {
				case err == nil:
					e["resource"] = doc
				case k == fault.KindNotFound || k == fault.KindForbidden || k == fault.KindInsufficientScope:
				default:
					return nil, nil, err
				}
			}
			entries = append(entries, e)
		}
	}
	b, err := json.Marshal(map[string]any{"resourceType": "Bundle", "id": newUUID(),
		"meta": map[string]any{"profile": []string{profNotification}}, "type": "history",
		"timestamp": time.Now().UTC().Format(time.RFC3339Nano), "entry": entries})
	return b, patients, err
}
