package events

import "carehub/kernel/jsonwire"

// Head is what a consumer routes an event by: its type, organization and project.
type Head struct {
	Type, OrgID, ProjectID string
}

// PeekHead reads an envelope's head without decoding the rest of the record: its type,
// organization and project, which Encode writes first (after the id). Consumers that act on
// few events (webhooks, triggers) use it to pass over the others without reading their
// payload, and Decode only those they act on: decoding was a tenth of the process's CPU per
// consumer when every event went through all three (docs/PERFORMANCE.md).
//
// ok is false when the record does not open as Encode writes it: an object whose first members
// are "id", "type", "orgId" and "projectId" (in any order) with string values without escapes.
// The caller then decodes the record, which also rejects one that is not an envelope. PeekHead
// does not check the rest of the record: a record it reads a head from may still be one Decode
// rejects, which a consumer that passes over it never finds out (the event log writer decodes
// every record and counts those). Only carehub writes to the events topic; a record written
// by anything else that repeated a head member further on (in another case, which
// encoding/json and Decode would take) is routed by its first spelling, which gives whoever
// can write to the topic nothing they could not do by writing the event they want.
func PeekHead(data []byte) (h Head, ok bool) {
	i := jsonwire.SkipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return Head{}, false
	}
	i++
	var have uint8 // bits: type, orgId, projectId
	for {
		key, next, ok := jsonwire.PlainString(data, jsonwire.SkipSpace(data, i))
		if !ok {
			return Head{}, false
		}
		i = jsonwire.SkipSpace(data, next)
		if i >= len(data) || data[i] != ':' {
			return Head{}, false
		}
		val, next, ok := jsonwire.PlainString(data, jsonwire.SkipSpace(data, i+1))
		if !ok {
			return Head{}, false
		}
		switch string(key) {
		case "id":
		case "type":
			h.Type, have = string(val), have|1
		case "orgId":
			h.OrgID, have = string(val), have|2
		case "projectId":
			h.ProjectID, have = string(val), have|4
		default:
			return Head{}, false
		}
		if have == 7 {
			break
		}
		i = jsonwire.SkipSpace(data, next)
		if i >= len(data) || data[i] != ',' {
			return Head{}, false
		}
		i++
	}
	return h, true
}
