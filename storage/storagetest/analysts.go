package storagetest

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"carehub/storage"
)

// analystEvents is a project's history the analysts' suites query: agent sessions that complete
// or fail with a latency, workflow runs with a duration in both payload shapes, device
// observations of two patients, a deployment change and alerts of several severities, one a
// minute from base. Another project of the organization and another organization hold one
// event each.
func analystEvents() (inProject, all []storage.Event) {
	at := func(i int) time.Duration { return time.Duration(i) * time.Minute }
	add := func(typ, severity, payload string) {
		ev := event("org_a", "prj_a", typ, at(len(inProject)), len(inProject))
		ev.Severity, ev.Payload = severity, json.RawMessage(payload)
		inProject = append(inProject, ev)
	}
	for i := range 10 {
		add("agent.run_completed", "info", fmt.Sprintf(`{"agentId":"agt_1","patientId":"pat_%d","status":"COMPLETED","latencyMs":%d}`, i%2, (i+1)*100))
	}
	for i := range 5 {
		add("agent.run.failed", "error", fmt.Sprintf(`{"agentId":"agt_2","patientId":"pat_1","status":"FAILED","latencyMs":%d}`, (i+1)*1000))
	}
	for i := range 4 {
		add("workflow.completed", "info", fmt.Sprintf(`{"workflowId":"wf_1","runId":"run_%d","status":"%s","durationMs":%d}`, i, []string{"COMPLETED", "FAILED"}[i%2], i*10))
	}
	add("workflow.run.completed", "warning", `{"workflow_id":"wf_1","run_id":"run_9","status":"COMPLETED","duration_ms":"not a number"}`)
	add("deployment.status_changed", "info", `{"deploymentId":"dep_1","from":"PENDING","to":"RUNNING"}`)
	add("device.observation_received", "info", `{"patientId":"pat_0","observationId":"obs_1"}`)
	add("diagnostic.result_ready", "critical", `{"patientId":"pat_0","severity":"HIGH"}`)
	all = append(slices.Clone(inProject),
		event("org_a", "prj_b", "agent.run_completed", time.Minute, 100),
		event("org_b", "prj_c", "agent.run_completed", time.Minute, 101))
	return inProject, all
}

func testEventRangesAndPatterns(t *testing.T, s storage.EventLog) {
	inProject, all := analystEvents()
	mustAppend(t, s, all)
	filter := func(keep func(storage.Event) bool) []storage.Event {
		var out []storage.Event
		for _, ev := range inProject {
			if keep(ev) {
				out = append(out, ev)
			}
		}
		return newestFirst(out)
	}
	typeIn := func(types ...string) func(storage.Event) bool {
		return func(e storage.Event) bool { return slices.Contains(types, e.Type) }
	}
	from, to := base.Add(3*time.Minute), base.Add(12*time.Minute)
	tests := []struct {
		name string
		q    storage.EventQuery
		want []storage.Event
	}{
		{"to exclusive", storage.EventQuery{To: to}, filter(func(e storage.Event) bool { return e.CreatedAt.Before(to) })},
		{"from and to", storage.EventQuery{Since: from, To: to},
			filter(func(e storage.Event) bool { return !e.CreatedAt.Before(from) && e.CreatedAt.Before(to) })},
		{"prefix", storage.EventQuery{Types: []string{"agent.*"}}, filter(typeIn("agent.run_completed", "agent.run.failed"))},
		{"prefix is a whole segment", storage.EventQuery{Types: []string{"agent.run*"}}, nil},
		{"prefix with underscore is literal", storage.EventQuery{Types: []string{"device_*"}}, nil},
		{"several types and a prefix", storage.EventQuery{Types: []string{"workflow.*", "deployment.status_changed"}},
			filter(typeIn("workflow.completed", "workflow.run.completed", "deployment.status_changed"))},
		{"every type", storage.EventQuery{Types: []string{"*"}}, filter(func(storage.Event) bool { return true })},
		{"exact types", storage.EventQuery{Types: []string{"agent.run.failed", "diagnostic.result_ready"}},
			filter(typeIn("agent.run.failed", "diagnostic.result_ready"))},
		{"patient", storage.EventQuery{PatientID: "pat_0"},
			filter(func(e storage.Event) bool { return payloadField(e, "patientId") == "pat_0" })},
		{"agent", storage.EventQuery{AgentID: "agt_2"}, filter(typeIn("agent.run.failed"))},
		{"workflow in either payload shape", storage.EventQuery{WorkflowID: "wf_1"}, filter(typeIn("workflow.completed", "workflow.run.completed"))},
		{"deployment", storage.EventQuery{DeploymentID: "dep_1"}, filter(typeIn("deployment.status_changed"))},
		{"patient and prefix and range", storage.EventQuery{PatientID: "pat_1", Types: []string{"agent.*"}, To: base.Add(12 * time.Minute)},
			filter(func(e storage.Event) bool {
				return payloadField(e, "patientId") == "pat_1" && e.CreatedAt.Before(base.Add(12*time.Minute))
			})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := tt.q
			q.OrgID, q.ProjectID = "org_a", "prj_a"
			for _, limit := range []int{1000, 3} {
				q.Limit = limit
				page := mustQuery(t, s, q)
				if page.Total != int64(len(tt.want)) {
					t.Errorf("limit %d: total %d, want %d", limit, page.Total, len(tt.want))
				}
				got, _ := queryAll(t, s, q)
				if !slices.Equal(eventIDs(got), eventIDs(tt.want)) {
					t.Errorf("limit %d: got %v, want %v", limit, eventIDs(got), eventIDs(tt.want))
				}
				q.Ascending = true
				got, _ = queryAll(t, s, q)
				q.Ascending = false
				if want := slices.Clone(eventIDs(tt.want)); !slices.Equal(eventIDs(got), reversed(want)) {
					t.Errorf("limit %d ascending: got %v, want %v", limit, eventIDs(got), reversed(want))
				}
			}
		})
	}
}

func reversed(s []string) []string {
	slices.Reverse(s)
	return s
}

func payloadField(e storage.Event, name string) string {
	var m map[string]any
	_ = json.Unmarshal(e.Payload, &m)
	s, _ := m[name].(string)
	return s
}

// testEventAscendingTies pages oldest first through runs of equal timestamps.
func testEventAscendingTies(t *testing.T, s storage.EventLog) {
	var evs []storage.Event
	for i := range 53 {
		evs = append(evs, event("org_a", "prj_a", "x.y", time.Duration(i/5)*time.Second, i))
	}
	mustAppend(t, s, evs)
	want := eventIDs(newestFirst(evs))
	slices.Reverse(want)
	for _, limit := range []int{1, 4, 5, 53, 100} {
		got, _ := queryAll(t, s, storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", Ascending: true, Limit: limit})
		if !slices.Equal(eventIDs(got), want) {
			t.Fatalf("limit %d: ascending paging visited %v, want %v", limit, eventIDs(got), want)
		}
	}
}

func testEventTotalModes(t *testing.T, s storage.EventLog) {
	_, all := analystEvents()
	mustAppend(t, s, all)
	q := storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", Types: []string{"agent.*"}, Limit: 2}
	q.Total = storage.TotalNone
	if page := mustQuery(t, s, q); page.Total != 0 || len(page.Events) != 2 || page.NextCursor == "" {
		t.Errorf("total none: total %d, %d events, cursor %q; want 0, 2 and a cursor", page.Total, len(page.Events), page.NextCursor)
	}
	q.Total = storage.TotalEstimate
	if page := mustQuery(t, s, q); page.Total < 1 || len(page.Events) != 2 {
		t.Errorf("total estimate: total %d with %d events; want a positive estimate", page.Total, len(page.Events))
	}
}

func testEventAggregate(t *testing.T, s storage.EventLog) {
	inProject, all := analystEvents()
	mustAppend(t, s, all)
	mustAppend(t, s, inProject[:3]) // copies count once
	agg := func(t *testing.T, q storage.AggregateQuery) []storage.AggregateRow {
		t.Helper()
		rows, err := s.AggregateEvents(ctxFor(t), q)
		if err != nil {
			t.Fatalf("AggregateEvents(%+v): %v", q, err)
		}
		return rows
	}
	key := func(rows []storage.AggregateRow) map[string]int64 {
		out := map[string]int64{}
		for _, r := range rows {
			out[r.Bucket.Format(time.RFC3339)+" "+r.Key] += r.Count
		}
		return out
	}
	t.Run("per type", func(t *testing.T) {
		got := key(agg(t, storage.AggregateQuery{OrgID: "org_a", ProjectID: "prj_a", GroupBy: storage.GroupType}))
		want := map[string]int64{}
		for _, ev := range inProject {
			want[time.Time{}.Format(time.RFC3339)+" "+ev.Type]++
		}
		if !mapsEqual(got, want) {
			t.Errorf("got %v, want %v", got, want)
		}
	})
	t.Run("per project of the organization", func(t *testing.T) {
		got := key(agg(t, storage.AggregateQuery{OrgID: "org_a", GroupBy: storage.GroupProject, Types: []string{"agent.*"}}))
		z := time.Time{}.Format(time.RFC3339)
		if want := map[string]int64{z + " prj_a": 15, z + " prj_b": 1}; !mapsEqual(got, want) {
			t.Errorf("got %v, want %v", got, want)
		}
	})
	t.Run("hour buckets in a half-hour time zone", func(t *testing.T) {
		// The events run from 09:26:53 UTC a minute apart; Kolkata (UTC+5:30) hours start at :30
		// UTC, so they fall in two buckets: 14:00 IST (08:30 UTC) and 15:00 IST (09:30 UTC).
		loc, err := time.LoadLocation("Asia/Kolkata")
		if err != nil {
			t.Skipf("no time zone data: %v", err)
		}
		rows := agg(t, storage.AggregateQuery{OrgID: "org_a", ProjectID: "prj_a", Bucket: storage.BucketHour, Location: loc})
		want := map[string]int64{}
		for _, ev := range inProject {
			local := ev.CreatedAt.In(loc)
			start := time.Date(local.Year(), local.Month(), local.Day(), local.Hour(), 0, 0, 0, loc)
			want[start.UTC().Format(time.RFC3339)+" "]++
		}
		if got := key(rows); !mapsEqual(got, want) || len(want) != 2 {
			t.Errorf("got %v, want %v (two buckets)", got, want)
		}
	})
	t.Run("day buckets", func(t *testing.T) {
		rows := agg(t, storage.AggregateQuery{OrgID: "org_a", ProjectID: "prj_a", Bucket: storage.BucketDay})
		if len(rows) != 1 || rows[0].Count != int64(len(inProject)) || !rows[0].Bucket.Equal(time.Date(2025, 3, 14, 0, 0, 0, 0, time.UTC)) {
			t.Errorf("got %+v, want one bucket of %d at 2025-03-14", rows, len(inProject))
		}
	})
	t.Run("minute buckets and a range", func(t *testing.T) {
		rows := agg(t, storage.AggregateQuery{OrgID: "org_a", ProjectID: "prj_a", Bucket: storage.BucketMinute,
			From: base.Add(2 * time.Minute), To: base.Add(5 * time.Minute)})
		if len(rows) != 3 || rows[0].Bucket.Add(time.Minute) != rows[1].Bucket || rows[0].Count != 1 {
			t.Errorf("got %+v, want three one-event minutes in order", rows)
		}
	})
	t.Run("outcomes of agent sessions", func(t *testing.T) {
		got := key(agg(t, storage.AggregateQuery{OrgID: "org_a", ProjectID: "prj_a", Types: []string{"agent.*"}, GroupBy: storage.GroupStatus}))
		z := time.Time{}.Format(time.RFC3339)
		if want := map[string]int64{z + " COMPLETED": 10, z + " FAILED": 5}; !mapsEqual(got, want) {
			t.Errorf("got %v, want %v", got, want)
		}
	})
	t.Run("alerts by severity", func(t *testing.T) {
		got := key(agg(t, storage.AggregateQuery{OrgID: "org_a", ProjectID: "prj_a", GroupBy: storage.GroupSeverity,
			Severities: []string{"warning", "error", "critical"}}))
		z := time.Time{}.Format(time.RFC3339)
		if want := map[string]int64{z + " error": 5, z + " warning": 1, z + " critical": 1}; !mapsEqual(got, want) {
			t.Errorf("got %v, want %v", got, want)
		}
	})
	t.Run("latency percentiles", func(t *testing.T) {
		rows := agg(t, storage.AggregateQuery{OrgID: "org_a", ProjectID: "prj_a", Types: []string{"agent.*"}, GroupBy: storage.GroupType, Latency: true})
		want := map[string][4]float64{ // measured, p50, p90, p99 by percentile_cont
			"agent.run.failed":    {5, 3000, 4600, 4960},
			"agent.run_completed": {10, 550, 910, 991},
		}
		for _, r := range rows {
			w := want[r.Key]
			if got := [4]float64{float64(r.Measured), r.P50, r.P90, r.P99}; !floatsNear(got, w) {
				t.Errorf("%s: measured, p50, p90, p99 = %v, want %v", r.Key, got, w)
			}
		}
		if len(rows) != 2 {
			t.Errorf("%d rows, want 2", len(rows))
		}
		rows = agg(t, storage.AggregateQuery{OrgID: "org_a", ProjectID: "prj_a", Types: []string{"workflow.*"}, Latency: true})
		if len(rows) != 1 || rows[0].Count != 5 || rows[0].Measured != 4 || !floatsNear([4]float64{rows[0].P50}, [4]float64{15}) {
			t.Errorf("workflow runs: %+v, want 5 counted, 4 measured (a string duration is not), p50 15", rows)
		}
	})
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func floatsNear(a, b [4]float64) bool {
	for i := range a {
		if math.Abs(a[i]-b[i]) > 1e-6*math.Max(1, math.Abs(b[i])) {
			return false
		}
	}
	return true
}

func testEventPurge(t *testing.T, s storage.EventLog) {
	inProject, all := analystEvents()
	mustAppend(t, s, all)
	cut := base.Add(10 * time.Minute)
	n, err := s.PurgeEvents(ctxFor(t), "org_a", cut)
	if err != nil {
		t.Fatalf("PurgeEvents: %v", err)
	}
	// prj_b's event (base+1m) is org_a's too; org_b's is not.
	if n != 11 {
		t.Errorf("purged %d, want 11", n)
	}
	got, _ := queryAll(t, s, storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", Limit: 1000})
	if want := eventIDs(newestFirst(inProject[10:])); !slices.Equal(eventIDs(got), want) {
		t.Errorf("after purge: %v, want %v", eventIDs(got), want)
	}
	if page := mustQuery(t, s, storage.EventQuery{OrgID: "org_b", ProjectID: "prj_c"}); page.Total != 1 {
		t.Errorf("another organization's events: %d left, want 1", page.Total)
	}
}

func testAuditPurge(t *testing.T, s storage.AuditLog) {
	var rs []storage.AuditRecord
	for i := range 6 {
		rs = append(rs, record("org_a", "key_1", "GET /v1/events", time.Duration(i)*time.Hour))
	}
	rs = append(rs, record("org_b", "key_2", "GET /v1/events", 0))
	mustAppendAudit(t, s, rs)
	n, err := s.PurgeAudit(ctxFor(t), "org_a", base.Add(3*time.Hour))
	if err != nil || n != 3 {
		t.Fatalf("PurgeAudit = %d, %v; want 3", n, err)
	}
	got := queryAllAudit(t, s, storage.AuditQuery{OrgID: "org_a"})
	if want := recordIDs(newestRecordsFirst(rs[3:6])); !slices.Equal(recordIDs(got), want) {
		t.Errorf("after purge: %v, want %v", recordIDs(got), want)
	}
	if got := queryAllAudit(t, s, storage.AuditQuery{OrgID: "org_b"}); len(got) != 1 {
		t.Errorf("another organization's records: %d left, want 1", len(got))
	}
}
