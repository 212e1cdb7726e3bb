package events_test

import (
	"strings"
	"testing"
	"time"

	"carehub/kernel/events"
)

const headValid = `{"id":"evt_01ke9nk500cmm0mhj9psxg961n","type":"device.observation_received","orgId":"org_1","projectId":"prj_1",` +
	`"source":"integration","severity":"info","payload":{"observationId":"obs_1","value":72.25},"createdAt":"2026-11-25T05:49:18.123456Z"}`

func TestPeekHead(t *testing.T) {
	want := events.Head{Type: "device.observation_received", OrgID: "org_1", ProjectID: "prj_1"}
	for _, tt := range []struct {
		name, data string
		ok         bool
	}{
		{"as Encode writes it", headValid, true},
		{"spaced", " {\n \"type\" : \"device.observation_received\" ,\t\"projectId\":\"prj_1\", \"orgId\":\"org_1\", \"payload\":", true},
		{"an escape in a value", strings.Replace(headValid, `"org_1"`, `"org\u005f1"`, 1), false},
		{"a key in another case", strings.Replace(headValid, `"type"`, `"Type"`, 1), false},
		{"another member first", strings.Replace(headValid, `{"id"`, `{"payload":{},"id"`, 1), false},
		{"a value not a string", strings.Replace(headValid, `"org_1"`, `7`, 1), false},
		{"cut in the head", headValid[:60], false},
		{"not an object", `["type","a"]`, false},
		{"empty", ``, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, ok := events.PeekHead([]byte(tt.data))
			if ok != tt.ok || (ok && h != want) {
				t.Fatalf("PeekHead = %+v, %v; want %+v, %v", h, ok, want, tt.ok)
			}
		})
	}
}

// FuzzPeekHead checks PeekHead against Decode on any input: whenever both read a record they
// agree on its head, and PeekHead reads every record Encode writes from an event whose head
// needs no escape.
//
//	go test -run '^$' -fuzz FuzzPeekHead -fuzztime 60s ./kernel/events/
func FuzzPeekHead(f *testing.F) {
	for _, s := range []string{
		headValid,
		strings.Replace(headValid, `"payload":{`, `"type":"other","payload":{`, 1),
		strings.Replace(headValid, `"orgId":"org_1"`, `"orgId":"org_é"`, 1),
		strings.Replace(headValid, `"projectId":"prj_1"`, `"projectId":""`, 1),
		`{"id":"a","type":"b","orgId":"c","projectId":"d"}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		h, ok := events.PeekHead([]byte(data))
		ev, err := events.Decode([]byte(data))
		if ok && err == nil && h != (events.Head{Type: ev.Type, OrgID: ev.OrgID, ProjectID: ev.ProjectID}) {
			t.Fatalf("PeekHead read %+v, Decode %q %q %q", h, ev.Type, ev.OrgID, ev.ProjectID)
		}
		if err != nil {
			return
		}
		enc, err := events.Encode(ev)
		if err != nil {
			return
		}
		h, ok = events.PeekHead(enc)
		plain := !strings.ContainsFunc(ev.Type+ev.OrgID+ev.ProjectID, func(r rune) bool { return r < 0x20 || r == '"' || r == '\\' })
		if plain && (!ok || h != (events.Head{Type: ev.Type, OrgID: ev.OrgID, ProjectID: ev.ProjectID})) {
			t.Fatalf("PeekHead(Encode(%+v)) = %+v, %v", ev, h, ok)
		}
	})
}

func TestPeekHeadReadsEncode(t *testing.T) {
	ev := events.Event{ID: "evt_01ke9nk500cmm0mhj9psxg961n", Type: "agent.run.completed", OrgID: "org_1", ProjectID: "prj_é",
		Source: "integration", Severity: "info", Payload: []byte(`{"a":1}`), CreatedAt: time.Now()}
	b, err := events.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	if h, ok := events.PeekHead(b); !ok || h != (events.Head{Type: ev.Type, OrgID: ev.OrgID, ProjectID: ev.ProjectID}) {
		t.Fatalf("PeekHead = %+v, %v", h, ok)
	}
}

func BenchmarkPeekHead(b *testing.B) {
	data := []byte(headValid)
	for b.Loop() {
		if _, ok := events.PeekHead(data); !ok {
			b.Fatal("not read")
		}
	}
}
