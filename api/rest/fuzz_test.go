package rest

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"carehub/api/envelope"
	"carehub/kernel/fault"
)

// FuzzQuery feeds arbitrary query strings to the edge check and the Query helper. Whatever the
// check lets through parses, is UTF-8 and holds no NUL; every typed parameter the helper hands a
// handler is within its bounds, and every problem is a 400.
func FuzzQuery(f *testing.F) {
	for _, s := range []string{"", "limit=20", "limit=", "limit=0", "limit=101", "limit=1&limit=2", "limit=%2020",
		"cursor=%%%x", "cursor=%zz", "a=1;b=2", "id=pat_%00", "x=%FF", "%00=1", "since=2026-05-01T12:00:00Z", "since=",
		"since=2026-13-01T00:00:00Z", "minRating=NaN", "minRating=Inf", "minRating=1e400", "minRating=-0", "type=AGENT",
		"type=agent", "type=", "badges=a,b&badges=c", "&&&", "=", "a", strings.Repeat("a=b&", 200)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		r := &http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/v1/x", RawQuery: raw}}
		if err := envelope.CheckRequest(r); err != nil {
			if fault.KindOf(err) != fault.KindInvalid {
				t.Fatalf("refusal %v is not a 400", err)
			}
			return
		}
		values, err := url.ParseQuery(raw)
		if err != nil {
			t.Fatalf("%q passed but does not parse: %v", raw, err)
		}
		for k, vs := range values {
			for _, v := range append(vs, k) {
				if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
					t.Fatalf("%q passed with %q", raw, v)
				}
			}
		}
		q := envelope.NewQuery(r)
		limit := q.Int("limit", 20, 1, 100)
		rating := q.Float("minRating")
		since := q.Time("since")
		typ := q.Enum("type", "AGENT", "MODEL")
		list := q.List("badges")
		if limit < 1 || limit > 100 {
			t.Fatalf("limit %d outside 1..100", limit)
		}
		if rating != nil && (math.IsNaN(*rating) || math.IsInf(*rating, 0)) {
			t.Fatalf("minRating %v", *rating)
		}
		if typ != "" && typ != "AGENT" && typ != "MODEL" {
			t.Fatalf("type %q", typ)
		}
		for _, b := range list {
			if b == "" || strings.Contains(b, ",") {
				t.Fatalf("badge %q", b)
			}
		}
		if err := q.Err(); err != nil {
			if fault.KindOf(err) != fault.KindInvalid {
				t.Fatalf("refusal %v is not a 400", err)
			}
			return
		}
		if vs := values["limit"]; len(vs) == 1 {
			if n, _ := strconv.Atoi(strings.TrimSpace(vs[0])); n != limit {
				t.Fatalf("limit %q read as %d", vs[0], limit)
			}
		}
		if vs := values["since"]; len(vs) == 1 {
			if want, _ := time.Parse(time.RFC3339Nano, strings.TrimSpace(vs[0])); !want.Equal(since) {
				t.Fatalf("since %q read as %v", vs[0], since)
			}
		}
	})
}

// FuzzDecodeJSON feeds arbitrary bodies to envelope.DecodeJSON. What it accepts is a UTF-8 JSON object
// without NUL, null members or unknown fields, which the standard strict decoder reads the same
// way; whatever it refuses is a 400.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{}`, `{"workflow_id":"wf_1","trigger":"event","input":{"patient_id":"pat_1"}}`,
		`{"workflow_id":"wf_1","bogus":1}`, `{"workflow_id":"a\u0000b"}`, `{"input":{"k\u0000":1}}`, `{"input":{"a":["\u0000"]}}`,
		`{"workflow_id":null}`, `{"workflow_id":1}`, `{} {}`, `{}x`, `[]`, `null`, `"x"`, "", " ", "{\"x\":\"\xff\"}",
		`{"workflow_id":"\ud800"}`, `{"input":"\\u0000"}`, `{"WORKFLOW_ID":"wf"}`, `{"workflow_id":"wf","workflow_id":"wf2"}`,
		`{"input":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := &http.Request{Method: http.MethodPost, Header: http.Header{"Content-Type": {"application/json"}},
			Body: http.NoBody}
		if body != nil {
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		var v StartRunRequest
		if err := envelope.DecodeJSON(r, &v); err != nil {
			if fault.KindOf(err) != fault.KindInvalid {
				t.Fatalf("refusal %v is not a 400", err)
			}
			return
		}
		if !utf8.Valid(body) || !json.Valid(body) || bytes.TrimSpace(body)[0] != '{' {
			t.Fatalf("accepted %q", body)
		}
		for _, s := range []string{v.WorkflowID, v.Trigger, string(v.Input)} {
			if strings.IndexByte(s, 0) >= 0 || strings.Contains(s, `\u0000`) && envelope.CheckJSONText([]byte(s)) != nil {
				t.Fatalf("accepted a NUL: %q", body)
			}
		}
		var again StartRunRequest
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&again); err != nil || again.WorkflowID != v.WorkflowID || again.Trigger != v.Trigger ||
			!bytes.Equal(again.Input, v.Input) {
			t.Fatalf("accepted %q, which the standard decoder reads as %+v (%v)", body, again, err)
		}
	})
}
