package rest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"carehub/api/envelope"
	"carehub/kernel/fault"
	"carehub/kernel/jsonwire"
	"carehub/kernel/phi"
	"carehub/processors/feed"
)

// PublishEventRequest is one event of POST /v1/events: the body is one of these, or an array
// of 1 to 1,000 of them.
type PublishEventRequest struct {
	ProjectID string          `json:"projectId"`
	Type      string          `json:"type"`
	Payload   json.RawMessage `json:"payload"`
}

// PublishedEvents is the answer of POST /v1/events: the events created, in the order of the
// request, as the caller may see them.
type PublishedEvents struct {
	Data []Event `json:"data"`
}

// PublishedEventRefs is the answer of POST /v1/events under Prefer: return=minimal: the id and
// time of each event created, in the order of the request.
type PublishedEventRefs struct {
	Data []EventRef `json:"data"`
}

// MarshalJSON writes the answer as encoding/json would, without reflection: an array answers
// up to 1,000 of them, and a time.Time's MarshalJSON, whose output encoding/json then checks
// again, cost more than all else the answer takes.
func (r PublishedEventRefs) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 16+len(r.Data)*80)
	b = append(b, `{"data":[`...)
	for i, ref := range r.Data {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonwire.AppendString(append(b, `{"id":`...), ref.ID)
		if y := ref.CreatedAt.Year(); y < 0 || y > 9999 {
			return nil, fmt.Errorf("event %s: created in year %d", ref.ID, y) // as time.Time's MarshalJSON refuses it
		}
		b = append(ref.CreatedAt.AppendFormat(append(b, `,"createdAt":"`...), time.RFC3339Nano), `"}`...)
	}
	return append(b, `]}`...), nil
}

// EventRef names one event created.
type EventRef struct {
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"createdAt"`
}

// publishEvents is POST /v1/events, publishEvent for high-volume producers: one event or an
// array of up to 1,000, all or nothing, in one transaction (feed.PublishBatch). 202 Accepted:
// the events are durable and reach the log, webhooks and subscriptions through the pipeline.
// Prefer: return=minimal answers their ids and times only: a producer of arrays has no use for
// its own events sent back, and writing (and reading) them was a sixth of the CPU an array of
// 1,000 cost end to end.
func (h *handlers) publishEvents(w http.ResponseWriter, r *http.Request) {
	drafts, array, err := decodeDrafts(r)
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	var evs []phi.Event
	if array {
		evs, err = h.s.Feed.PublishBatch(r.Context(), drafts)
	} else {
		var ev *phi.Event
		if ev, err = h.s.Feed.Publish(r.Context(), drafts[0].Type, drafts[0].Payload, drafts[0].ProjectID); err == nil {
			evs = []phi.Event{*ev}
		}
	}
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	if envelope.Prefers(r, "return", "minimal") {
		out := PublishedEventRefs{Data: make([]EventRef, len(evs))}
		for i, e := range evs {
			out.Data[i] = EventRef{ID: e.ID, CreatedAt: e.CreatedAt.UTC()}
		}
		b, err := out.MarshalJSON()
		if err != nil {
			envelope.WriteError(w, r, err)
			return
		}
		w.Header().Set("Preference-Applied", "return=minimal")
		envelope.WriteEncoded(w, http.StatusAccepted, b)
		return
	}
	out := PublishedEvents{Data: make([]Event, len(evs))}
	for i, e := range evs {
		out.Data[i] = eventOf(e)
	}
	envelope.WriteJSON(w, http.StatusAccepted, out)
}

// decodeDrafts reads the body of POST /v1/events strictly, as DecodeJSON reads an object, and
// reports whether it was an array; an element of an array is named "[i]" in the errors (as
// "[3].type").
func decodeDrafts(r *http.Request) (_ []feed.Draft, array bool, _ error) {
	b, err := envelope.ReadJSON(r)
	if err != nil {
		return nil, false, err
	}
	switch bytes.TrimSpace(b)[0] {
	case '[':
	case '{':
		var one PublishEventRequest
		if err := envelope.DecodeObject(b, &one); err != nil {
			return nil, false, err
		}
		return []feed.Draft{draftOf(one)}, false, nil
	default:
		return nil, false, fault.Invalid("the request body must be a JSON object (one event) or an array of them")
	}
	if drafts, ok := wellFormedArray(b); ok {
		return drafts, true, nil
	}
	drafts, err := decodeElements(b)
	return drafts, true, err
}

// decodeElements decodes the array b element by element with envelope.DecodeObject, naming the
// element in an error.
func decodeElements(b []byte) ([]feed.Draft, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(b, &items); err != nil {
		return nil, envelope.JSONError(err)
	}
	if len(items) == 0 || len(items) > feed.MaxBatch {
		return nil, fault.Invalid("the array holds %d events; send 1 to %d", len(items), feed.MaxBatch)
	}
	drafts := make([]feed.Draft, len(items))
	for i, item := range items {
		var one PublishEventRequest
		if err := envelope.DecodeObject(item, &one); err != nil {
			return nil, inElement(i, err)
		}
		drafts[i] = draftOf(one)
	}
	return drafts, nil
}

// wellFormedArray decodes an array of 1 to feed.MaxBatch events in one strict pass when nothing
// in it is refused, as decoding each element with envelope.DecodeObject would; otherwise it
// returns false, and decodeElements says what is wrong and in which element.
// Arrays of 1,000 are the high-volume path: the body is checked once and walked once (jsonwire),
// each payload kept as the bytes it is in the body. Only the exact member names are taken here;
// a name matched case-insensitively, or any other, goes element-wise, which decides it.
func wellFormedArray(b []byte) ([]feed.Draft, bool) {
	if bytes.Contains(b, []byte("null")) || !jsonwire.Valid(b) {
		// DecodeObject refuses a null member even when a later member of the same name (matched
		// case-insensitively) replaces it; one pass cannot tell, so such bodies go element-wise,
		// as do bodies that are not JSON (decodeElements names the fault).
		return nil, false
	}
	var drafts []feed.Draft
	err := jsonwire.Elements(b, func(el []byte) error {
		if len(drafts) == feed.MaxBatch {
			return errElementWise
		}
		var (
			d    feed.Draft
			seen int
		)
		err := jsonwire.Members(el, func(key, v []byte) error {
			switch string(key) {
			case "projectId":
				seen |= 1
				return jsonwire.String(v, &d.ProjectID)
			case "type":
				seen |= 2
				return jsonwire.String(v, &d.Type)
			case "payload":
				seen |= 4
				d.Payload = v
				return nil
			}
			return errElementWise
		})
		if err != nil || seen != 7 { // an element that is not an object has no members
			return errElementWise
		}
		drafts = append(drafts, d)
		return nil
	})
	return drafts, err == nil && len(drafts) > 0
}

// errElementWise stops wellFormedArray's pass: the body needs decodeElements.
var errElementWise = errors.New("decode element by element")

func draftOf(e PublishEventRequest) feed.Draft {
	return feed.Draft{ProjectID: e.ProjectID, Type: e.Type, Payload: e.Payload}
}

// inElement names element i of the body's array in err: the field "type" becomes "[i].type".
func inElement(i int, err error) error {
	var fe *fault.Error
	if !errors.As(err, &fe) {
		return err
	}
	out := *fe
	out.Message = fmt.Sprintf("[%d]: %s", i, fe.Message)
	if field, ok := fe.Details["field"].(string); ok {
		out.Details = map[string]any{"field": fmt.Sprintf("[%d].%s", i, field)}
		out.Message = fmt.Sprintf("[%d].%s", i, fe.Message)
	}
	return &out
}
