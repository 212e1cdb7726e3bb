package attacktest

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// Finding 8 of issue 51: groupBy=status (REST and GraphQL) gave test and billing keys the
// payload values of events naming real patients, and a test key filtering events by a real
// patientId learnt that the patient's events exist.

// secretStatus is a payload value of an event about the real patient: patient data, as every
// value of a free-form event naming a patient is.
const (
	secretStatus  = "POSITIVE_FOR_SOMETHING_PRIVATE"
	secretLatency = 4242
	statsType     = "lab.result_noted"
)

type statsRow struct {
	Key      string   `json:"key"`
	Count    int      `json:"count"`
	Measured *int     `json:"measured"`
	P50      *float64 `json:"p50"`
}

func restStats(t *testing.T, s *servertest.Server, key, project string, from time.Time) []statsRow {
	t.Helper()
	q := url.Values{"projectId": {project}, "from": {from.Format(time.RFC3339)}, "groupBy": {"status"}, "latency": {"true"},
		"types": {statsType}}
	r := s.Do(http.MethodGet, "/v1/events/stats?"+q.Encode(), key, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET /v1/events/stats: HTTP %d %s", r.Status, r.Body)
	}
	var out struct{ Data []statsRow }
	r.JSON(t, &out)
	return out.Data
}

func gqlStats(t *testing.T, s *servertest.Server, key, project string, from time.Time) []statsRow {
	t.Helper()
	var out struct{ EventStats []statsRow }
	s.MustGraphQL(t, key, `query($p: ID, $f: DateTime!, $t: [String!]) {
		eventStats(projectId: $p, from: $f, types: $t, groupBy: STATUS, latency: true) { key count measured p50 } }`,
		map[string]any{"p": project, "f": from.Format(time.RFC3339), "t": []string{statsType}}, &out)
	return out.EventStats
}

// leaks reports how rows give away the secret event's payload values.
func leaks(rows []statsRow) string {
	for _, r := range rows {
		switch {
		case strings.Contains(r.Key, secretStatus):
			return "its status " + r.Key
		case r.Measured != nil && *r.Measured > 0:
			return "its run time"
		}
	}
	return ""
}

func TestStatisticsAndFiltersKeepPatientData(t *testing.T) {
	s := servertest.Start(t)
	project := s.ProjectID(demo.SepsisProjectName)
	live := s.DemoKey()
	from := time.Now().Add(-time.Hour).UTC()

	payload := map[string]any{"patientId": demo.RealPatientID, "status": secretStatus, "latencyMs": secretLatency}
	if res := s.GraphQL(live, `mutation($t: String!, $p: ID!, $pl: JSON!) { publishEvent(type: $t, payload: $pl, projectId: $p) { id } }`,
		map[string]any{"t": statsType, "p": project, "pl": payload}); len(res.Errors) > 0 {
		t.Fatalf("publish: %+v", res.Errors)
	}
	// A reader who may see the patient is given the status and run time, once the log has it.
	servertest.Eventually(t, 30*time.Second, "the event in the statistics", func() bool {
		rows := restStats(t, s, live, project, from)
		return len(rows) == 1 && rows[0].Key == secretStatus && rows[0].P50 != nil && *rows[0].P50 == secretLatency
	})
	if rows := gqlStats(t, s, live, project, from); leaks(rows) == "" {
		t.Fatalf("live reader with every patient scope, GraphQL: %+v; want the status and run time", rows)
	}

	for _, k := range []struct {
		name string
		key  string
	}{
		{"test key with the patient scopes", s.Key(demo.DemoOrgSlug, access.Test, access.ReadPatients, access.ReadObservations)},
		{"billing key", s.Key(demo.DemoOrgSlug, access.Live, access.AdminBilling)},
		{"live key without read:observations", s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients)},
	} {
		for path, rows := range map[string][]statsRow{"REST": restStats(t, s, k.key, project, from), "GraphQL": gqlStats(t, s, k.key, project, from)} {
			if what := leaks(rows); what != "" {
				t.Errorf("%s, %s: statistics give %s: %+v", k.name, path, what, rows)
			}
			if len(rows) != 1 || rows[0].Key != "(redacted)" || rows[0].Count != 1 {
				t.Errorf("%s, %s: %+v; want the event counted under (redacted)", k.name, path, rows)
			}
		}
	}

	// A test key filtering by the real patient gets what it gets for a patient nobody has.
	test := s.Key(demo.DemoOrgSlug, access.Test, access.ReadPatients, access.ReadObservations)
	real := eventsAbout(t, s, test, project, demo.RealPatientID)
	unknown := eventsAbout(t, s, test, project, "pat_01kf3fm8c0xbzcfajp6n9d2emz")
	if real != unknown {
		t.Fatalf("test key, patientId filter: real patient %s, unknown patient %s", real, unknown)
	}
	if live := eventsAbout(t, s, live, project, demo.RealPatientID); !strings.Contains(live, statsType) {
		t.Fatalf("live key, patientId filter: %s; want the real patient's event", live)
	}
}

// eventsAbout returns what GET /v1/events and the eventHistory query answer key filtering by
// patient, with the patient's id blanked so that two answers compare.
func eventsAbout(t *testing.T, s *servertest.Server, key, project, patient string) string {
	t.Helper()
	r := s.Do(http.MethodGet, "/v1/events?"+url.Values{"projectId": {project}, "patientId": {patient}}.Encode(), key, nil)
	res := s.GraphQL(key, `query($p: ID!, $pt: ID) { eventHistory(projectId: $p, patientId: $pt) { events { type } total } }`,
		map[string]any{"p": project, "pt": patient})
	gql, _ := json.Marshal(res)
	return strings.ReplaceAll(string(r.Body)+" "+string(gql), patient, "<patient>")
}
