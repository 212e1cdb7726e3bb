package feed

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
)

// TestDraftEventNamesEveryFault checks the fields draftEvent refuses, each alone and together,
// since the payload is read once for all its checks.
func TestDraftEventNamesEveryFault(t *testing.T) {
	deep := strings.Repeat(`{"a":`, 130) + `1` + strings.Repeat(`}`, 130)
	for _, c := range []struct {
		name      string
		d         Draft
		want      []string
		wantValue string
	}{
		{"valid", Draft{"prj_1", "a.b", json.RawMessage(` {"x":[1,2]}`)}, nil, ""},
		{"no project", Draft{"", "a.b", json.RawMessage(`{}`)}, []string{"[0].projectId"}, ""},
		{"bad type", Draft{"prj_1", "A", json.RawMessage(`{}`)}, []string{"[0].type"}, ""},
		{"not an object", Draft{"prj_1", "a.b", json.RawMessage(`[1]`)}, []string{"[0].payload"}, "must be a JSON object"},
		{"not JSON", Draft{"prj_1", "a.b", json.RawMessage(`{"x":}`)}, []string{"[0].payload"}, "must be a JSON object"},
		{"too large", Draft{"prj_1", "a.b", json.RawMessage(`{"x":"` + strings.Repeat("y", MaxPayloadBytes) + `"}`)}, []string{"[0].payload"}, "is 262152 bytes; at most 262144 (256 KiB) are allowed"},
		{"unstorable number", Draft{"prj_1", "a.b", json.RawMessage(`{"x":{"y":1e400}}`)}, []string{"[0].payload.x.y"}, ""},
		{"too deep", Draft{"prj_1", "a.b", json.RawMessage(deep)}, []string{"[0].payload" + strings.Repeat(".a", 128)}, "nests deeper than 128 arrays and objects"},
		{"repeated member", Draft{"prj_1", "a.b", json.RawMessage(`{"patientId":"a","patientId":"b"}`)}, []string{"[0].payload"}, `names the member "patientId" twice`},
		{"bad type, unstorable payload", Draft{"prj_1", "A", json.RawMessage(`{"x":1e400}`)}, []string{"[0].payload.x", "[0].type"}, ""},
		{"bad type, repeated member", Draft{"prj_1", "A", json.RawMessage(`{"a":1,"a":2}`)}, []string{"[0].payload", "[0].type"}, ""},
		{"everything", Draft{"", "A", json.RawMessage(`"x"`)}, []string{"[0].payload", "[0].projectId", "[0].type"}, ""},
	} {
		bad := map[string]string{}
		ev := draftEvent(c.d, "[0].", bad)
		if got := slices.Sorted(maps.Keys(bad)); !slices.Equal(got, c.want) {
			t.Errorf("%s: fields %v, want %v", c.name, bad, c.want)
			continue
		}
		if c.wantValue != "" && bad[c.want[0]] != c.wantValue {
			t.Errorf("%s: %q, want %q", c.name, bad[c.want[0]], c.wantValue)
		}
		if len(c.want) == 0 && (ev.ID == "" || ev.Type != c.d.Type || ev.ProjectID != c.d.ProjectID || ev.OrgID != "" ||
			string(ev.Payload) != string(c.d.Payload) || ev.CreatedAt.IsZero()) {
			t.Errorf("%s: event %+v", c.name, ev)
		}
	}
}
