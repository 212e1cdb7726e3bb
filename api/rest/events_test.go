package rest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/kernel/ids"
	"carehub/storage/demo"
)

type published struct {
	Data []struct {
		ID, Type, ProjectID, Source, Severity string
		Payload                               struct{ Seq int }
		CreatedAt                             time.Time
	}
}

// post sends body (JSON-encoded unless a string) to POST /v1/events with the extra headers
// (name, value, …).
func post(t *testing.T, s *servertest.Server, key string, body any, headers ...string) *servertest.Response {
	t.Helper()
	b, ok := body.(string)
	if !ok {
		buf, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		b = string(buf)
	}
	req, err := http.NewRequest(http.MethodPost, s.URL+"/v1/events", strings.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return &servertest.Response{Status: resp.StatusCode, Header: resp.Header, Body: out}
}

func draft(project, typ string, seq int) map[string]any {
	return map[string]any{"projectId": project, "type": typ, "payload": map[string]any{"seq": seq}}
}

func drafts(project, typ string, n int) []map[string]any {
	out := make([]map[string]any, n)
	for i := range out {
		out[i] = draft(project, typ, i)
	}
	return out
}

// TestPublishEvents drives POST /v1/events: one event or an array, all or nothing, strict
// input, scopes, tenancy, Idempotency-Key, and the events reaching the log.
func TestPublishEvents(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	sepsis := s.ProjectID(demo.SepsisProjectName)
	typ := fmt.Sprintf("resttest.batch_%d", time.Now().UnixNano())
	inOutbox := func(typ string) int {
		var n int
		if err := s.Pool().QueryRow(context.Background(), `select count(*) from outbox where value->>'type' = $1`, typ).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	t.Run("one event or an array, in order, into the log", func(t *testing.T) {
		var one, many published
		r := post(t, s, key, draft(sepsis, typ, 100))
		if r.Status != http.StatusAccepted {
			t.Fatalf("one event: %d %s", r.Status, r.Body)
		}
		r.JSON(t, &one)
		r = post(t, s, key, drafts(sepsis, typ, 250))
		if r.Status != http.StatusAccepted {
			t.Fatalf("an array: %d %s", r.Status, r.Body)
		}
		r.JSON(t, &many)
		if len(one.Data) != 1 || one.Data[0].Payload.Seq != 100 || len(many.Data) != 250 {
			t.Fatalf("answers hold %d and %d events, want 1 and 250", len(one.Data), len(many.Data))
		}
		for i, ev := range append(one.Data, many.Data...) {
			if !strings.HasPrefix(ev.ID, "evt_") || ev.Type != typ || ev.ProjectID != sepsis || ev.Source != "integration" ||
				ev.Severity != "info" || ev.CreatedAt.IsZero() || i > 0 && ev.Payload.Seq != i-1 {
				t.Fatalf("event %d: %+v", i, ev)
			}
		}
		q := url.Values{"projectId": {sepsis}, "type": {typ}, "limit": {"1"}}.Encode()
		servertest.Eventually(t, 60*time.Second, "the 251 events in the log", func() bool {
			var page struct{ Meta struct{ Total int } }
			s.Do(http.MethodGet, "/v1/events?"+q, key, nil).JSON(t, &page)
			return page.Meta.Total == 251
		})
	})

	t.Run("Prefer: return=minimal answers ids and times", func(t *testing.T) {
		minimal := fmt.Sprintf("resttest.minimal_%d", time.Now().UnixNano())
		r := post(t, s, key, drafts(sepsis, minimal, 3), "Prefer", "respond-async, return=minimal")
		if r.Status != http.StatusAccepted || r.Header.Get("Preference-Applied") != "return=minimal" {
			t.Fatalf("%d (Preference-Applied %q) %s", r.Status, r.Header.Get("Preference-Applied"), r.Body)
		}
		var refs struct {
			Data []map[string]any `json:"data"`
		}
		r.JSON(t, &refs)
		for _, ref := range refs.Data {
			id, _ := ref["id"].(string)
			at, _ := ref["createdAt"].(string)
			if _, err := time.Parse(time.RFC3339Nano, at); len(ref) != 2 || !strings.HasPrefix(id, "evt_") || err != nil {
				t.Fatalf("a minimal answer's event: %v", ref)
			}
		}
		if len(refs.Data) != 3 || inOutbox(minimal) != 0 {
			t.Fatalf("%d refs (want 3) for %s", len(refs.Data), r.Body)
		}
		q := url.Values{"projectId": {sepsis}, "type": {minimal}, "limit": {"10"}, "order": {"asc"}}.Encode()
		servertest.Eventually(t, 60*time.Second, "the 3 events in the log, as answered", func() bool {
			var page struct{ Data []map[string]any }
			s.Do(http.MethodGet, "/v1/events?"+q, key, nil).JSON(t, &page)
			if len(page.Data) != 3 {
				return false
			}
			for i, ev := range page.Data {
				if ev["id"] != refs.Data[i]["id"] || ev["createdAt"] != refs.Data[i]["createdAt"] {
					t.Fatalf("event %d in the log %v, answered %v", i, ev, refs.Data[i])
				}
			}
			return true
		})
		if r := post(t, s, key, draft(sepsis, minimal, 1), "Prefer", "return=representation"); r.Header.Get("Preference-Applied") != "" || !strings.Contains(string(r.Body), `"payload"`) {
			t.Errorf("return=representation: %s %s", r.Header, r.Body)
		}
	})

	t.Run("all or nothing", func(t *testing.T) {
		other := fmt.Sprintf("resttest.none_%d", time.Now().UnixNano())
		batch := drafts(sepsis, other, 5)
		batch[3]["type"] = "Not A Type"
		batch[4]["payload"] = "text"
		e := wantError(t, post(t, s, key, batch), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
		if f, _ := e.Error.Details["fields"].(map[string]any); f["[3].type"] == nil || f["[4].payload"] == nil || len(f) != 2 {
			t.Errorf("details %v: want the fields [3].type and [4].payload", e.Error.Details)
		}
		r := post(t, s, key, `[{"projectId":"`+sepsis+`","type":"a.b","payload":{"patientId":"pat_a","x":1,"patientId":"pat_b"}}]`)
		e = wantError(t, r, http.StatusUnprocessableEntity, "VALIDATION_FAILED")
		if f, _ := e.Error.Details["fields"].(map[string]any); f["[0].payload"] == nil {
			t.Errorf("a payload naming patientId twice: details %v", e.Error.Details)
		}
		wantError(t, post(t, s, key, `{"projectId":"`+sepsis+`","type":"a.b","payload":{"a":1,"a":2}}`), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
		batch = drafts(sepsis, other, 3)
		batch[2]["projectId"] = "prj_01jz0000000000000000000000"
		wantError(t, post(t, s, key, batch), http.StatusNotFound, "NOT_FOUND")
		if n := inOutbox(other); n != 0 {
			t.Errorf("%d events of refused batches in the outbox", n)
		}
	})

	t.Run("strict input", func(t *testing.T) {
		for _, c := range []struct {
			name  string
			body  any
			field string
		}{
			{"empty array", `[]`, ""},
			{"1,001 events", drafts(sepsis, typ, 1001), ""},
			{"not an object or array", `"x"`, ""},
			{"an element not an object", `[{"projectId":"p","type":"a.b","payload":{}}, 7]`, ""},
			{"unknown field in an element", `[{"projectId":"p","type":"a.b","payload":{}}, {"projectId":"p","type":"a.b","payload":{},"bogus":1}]`, "[1].bogus"},
			{"null in an element", `[{"projectId":null,"type":"a.b","payload":{}}]`, "[0].projectId"},
			{"NUL in an element", `[{"projectId":"p","type":"a.b\u0000","payload":{}}]`, "[0].type"},
			{"unknown field", `{"projectId":"p","type":"a.b","payload":{},"bogus":1}`, "bogus"},
			{"trailing data", `[] []`, ""},
		} {
			r := post(t, s, key, c.body)
			e := wantError(t, r, http.StatusBadRequest, "INVALID_REQUEST")
			if c.field != "" && e.Error.Details["field"] != c.field {
				t.Errorf("%s: field %v, want %s (%s)", c.name, e.Error.Details["field"], c.field, r.Body)
			}
		}
		e := wantError(t, post(t, s, key, `{"type":"a.b","payload":{}}`), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
		if f, _ := e.Error.Details["fields"].(map[string]any); f["projectId"] == nil {
			t.Errorf("missing projectId: details %v", e.Error.Details)
		}
	})

	t.Run("scope and tenancy", func(t *testing.T) {
		noScope := s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients)
		wantError(t, post(t, s, noScope, drafts(sepsis, typ, 2)), http.StatusForbidden, "INSUFFICIENT_SCOPE")
		org := ids.New(ids.Organization)
		if _, err := s.Pool().Exec(context.Background(), `insert into organizations (id, name, slug, type, plan)
values ($1, 'other', $1, 'clinic', 'starter')`, org); err != nil {
			t.Fatal(err)
		}
		outsider := s.Key(org, access.Live, access.ExecWorkflows)
		wantError(t, post(t, s, outsider, drafts(sepsis, typ, 2)), http.StatusNotFound, "NOT_FOUND")
	})

	t.Run("Idempotency-Key", func(t *testing.T) {
		idem := fmt.Sprintf("resttest.idem_%d", time.Now().UnixNano())
		body := drafts(sepsis, idem, 3)
		first := post(t, s, key, body, "Idempotency-Key", idem)
		again := post(t, s, key, body, "Idempotency-Key", idem)
		if first.Status != http.StatusAccepted || again.Status != http.StatusAccepted || again.Header.Get("Idempotent-Replayed") != "true" ||
			!bytes.Equal(first.Body, again.Body) {
			t.Fatalf("first %d %s; again %d (replayed %q) %s", first.Status, first.Body, again.Status,
				again.Header.Get("Idempotent-Replayed"), again.Body)
		}
		wantError(t, post(t, s, key, drafts(sepsis, idem, 4), "Idempotency-Key", idem), http.StatusConflict, "CONFLICT")
		if n := inOutbox(idem); n != 3 {
			t.Errorf("%d events in the outbox, want 3", n)
		}
	})
}
