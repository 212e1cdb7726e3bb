package storagetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"carehub/kernel/events"
	"carehub/storage"
)

// analystEvents is a project's history the analysts' suites query: agent sessions that complete
// or fail with a latency, workflow runs with a duration in both payload shapes, device
// observations of two patients, a deployment change and alerts of several severities, one a
// minute from base. Another project of the organization and another organization hold one
// event each.
func analystEvents() (inProject, all []events.Event) {
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
	filter := func(keep func(events.Event) bool) []events.Event { return newestFirst(where(inProject, keep)) }
	typeIn := func(types ...string) func(events.Event) bool {
		return func(e events.Event) bool { return slices.Contains(types, e.Type) }
	}
	from, to := base.Add(3*time.Minute), base.Add(12*time.Minute)
	tests := []struct {
		name string
		q    storage.EventQuery
		want []events.Event
	}{
		{"to exclusive", storage.EventQuery{To: to}, filter(func(e events.Event) bool { return e.CreatedAt.Before(to) })},
		{"from and to", storage.EventQuery{Since: from, To: to},
			filter(func(e events.Event) bool { return !e.CreatedAt.Before(from) && e.CreatedAt.Before(to) })},
		{"prefix", storage.EventQuery{Types: []string{"agent.*"}}, filter(typeIn("agent.run_completed", "agent.run.failed"))},
		{"prefix is a whole segment", storage.EventQuery{Types: []string{"agent.run*"}}, nil},
		{"prefix with underscore is literal", storage.EventQuery{Types: []string{"device_*"}}, nil},
		{"several types and a prefix", storage.EventQuery{Types: []string{"workflow.*", "deployment.status_changed"}},
			filter(typeIn("workflow.completed", "workflow.run.completed", "deployment.status_changed"))},
		{"every type", storage.EventQuery{Types: []string{"*"}}, filter(func(events.Event) bool { return true })},
		{"exact types", storage.EventQuery{Types: []string{"agent.run.failed", "diagnostic.result_ready"}},
			filter(typeIn("agent.run.failed", "diagnostic.result_ready"))},
		{"patient", storage.EventQuery{PatientID: "pat_0"},
			filter(func(e events.Event) bool { return payloadField(e, "patientId") == "pat_0" })},
		{"agent", storage.EventQuery{AgentID: "agt_2"}, filter(typeIn("agent.run.failed"))},
		{"workflow in either payload shape", storage.EventQuery{WorkflowID: "wf_1"}, filter(typeIn("workflow.completed", "workflow.run.completed"))},
		{"deployment", storage.EventQuery{DeploymentID: "dep_1"}, filter(typeIn("deployment.status_changed"))},
		{"patient and prefix and range", storage.EventQuery{PatientID: "pat_1", Types: []string{"agent.*"}, To: base.Add(12 * time.Minute)},
			filter(func(e events.Event) bool {
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

func payloadField(e events.Event, name string) string {
	var m map[string]any
	_ = json.Unmarshal(e.Payload, &m)
	s, _ := m[name].(string)
	return s
}

// testEventAscendingTies pages oldest first through runs of equal timestamps.
func testEventAscendingTies(t *testing.T, s storage.EventLog) {
	var evs []events.Event
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
	// A patient's page too (on ClickHouse it reads the projection by patient, which the purge
	// must reach as well).
	for _, patient := range []string{"pat_0", "pat_1"} {
		got, _ := queryAll(t, s, storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", PatientID: patient, Limit: 1000})
		var want []events.Event
		for _, e := range inProject[10:] {
			if payloadField(e, "patientId") == patient {
				want = append(want, e)
			}
		}
		if len(want) == 0 {
			t.Fatalf("no event of %s survives the purge: the check proves nothing", patient)
		}
		if !slices.Equal(eventIDs(got), eventIDs(newestFirst(want))) {
			t.Errorf("%s after purge: %v, want %v", patient, eventIDs(got), eventIDs(newestFirst(want)))
		}
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

// spreadEvents is a project's events every seven minutes over about five hours from base, of
// types, severities and statuses in turn, and one event of another project and organization.
func spreadEvents() (inProject, all []events.Event) {
	types := []string{"agent.run_completed", "agent.run.failed", "workflow.completed", "diagnostic.result_ready"}
	severities := []string{"info", "error", "warning", "critical", "info"}
	for i := range 40 {
		ev := event("org_a", "prj_a", types[i%len(types)], time.Duration(i)*7*time.Minute, i)
		ev.Severity = severities[i%len(severities)]
		ev.Payload = json.RawMessage(fmt.Sprintf(`{"status":"%s","latencyMs":%d}`, []string{"COMPLETED", "FAILED", ""}[i%3], i))
		inProject = append(inProject, ev)
	}
	all = append(slices.Clone(inProject), event("org_a", "prj_b", "agent.run_completed", time.Hour, 100),
		event("org_b", "prj_c", "agent.run_completed", time.Hour, 101))
	return inProject, all
}

// testEventAggregatePaths checks that counts agree with the events stored, whichever way a store
// computes them: a store may answer whole hours from pre-aggregated sums and the rest of a range
// (or percentiles, minute buckets, zones off whole hours) from the events themselves. The same
// counts must come back after copies of stored events are appended (in a later batch and twice
// in one batch) and after a purge that cuts through an hour.
func testEventAggregatePaths(t *testing.T, s storage.EventLog) {
	inProject, all := spreadEvents()
	mustAppend(t, s, all)
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skipf("no time zone data: %v", err)
	}
	kolkata, err := time.LoadLocation("Asia/Kolkata")
	if err != nil {
		t.Skipf("no time zone data: %v", err)
	}
	hour := base.Truncate(time.Hour)
	queries := []struct {
		name string
		q    storage.AggregateQuery
	}{
		{"per type per hour, whole range", storage.AggregateQuery{Bucket: storage.BucketHour, GroupBy: storage.GroupType}},
		{"per type per hour, whole hours", storage.AggregateQuery{Bucket: storage.BucketHour, GroupBy: storage.GroupType,
			From: hour.Add(time.Hour), To: hour.Add(4 * time.Hour)}},
		{"per severity per hour in Paris, range off the hour", storage.AggregateQuery{Bucket: storage.BucketHour,
			Location: paris, GroupBy: storage.GroupSeverity, From: base.Add(20 * time.Minute), To: base.Add(200 * time.Minute)}},
		{"per status per day in Kolkata, range off the hour", storage.AggregateQuery{Bucket: storage.BucketDay,
			Location: kolkata, GroupBy: storage.GroupStatus, From: base.Add(20 * time.Minute), To: base.Add(200 * time.Minute)}},
		{"per project, a type prefix, within one hour", storage.AggregateQuery{GroupBy: storage.GroupProject,
			Types: []string{"agent.*"}, From: hour.Add(65 * time.Minute), To: hour.Add(110 * time.Minute)}},
		{"alerts per hour", storage.AggregateQuery{Bucket: storage.BucketHour, Severities: []string{"error", "critical"}}},
		{"per minute", storage.AggregateQuery{Bucket: storage.BucketMinute, From: hour.Add(time.Hour), To: hour.Add(2 * time.Hour)}},
	}
	check := func(t *testing.T, events []events.Event) {
		for _, tt := range queries {
			q := tt.q
			q.OrgID = "org_a"
			if q.GroupBy != storage.GroupProject {
				q.ProjectID = "prj_a"
			}
			want := countEvents(q, events)
			rows, err := s.AggregateEvents(ctxFor(t), q)
			if err != nil {
				t.Fatalf("%s: %v", tt.name, err)
			}
			if got := aggregateCounts(rows); !mapsEqual(got, want) {
				t.Errorf("%s: got %v, want %v", tt.name, got, want)
			}
			q.Latency = true // percentiles: counted from the events themselves
			if rows, err = s.AggregateEvents(ctxFor(t), q); err != nil {
				t.Fatalf("%s with latency: %v", tt.name, err)
			}
			if got := aggregateCounts(rows); !mapsEqual(got, want) {
				t.Errorf("%s with latency: got %v, want %v", tt.name, got, want)
			}
		}
	}
	withOther := append(slices.Clone(inProject), all[len(inProject)])
	check(t, withOther)
	mustAppend(t, s, inProject[10:20])
	mustAppend(t, s, []events.Event{inProject[21], inProject[22], inProject[21]})
	copyInBatch := event("org_a", "prj_a", "agent.run_completed", 3*time.Hour+time.Second, 200)
	mustAppend(t, s, []events.Event{copyInBatch, copyInBatch})
	withOther = append(withOther, copyInBatch)
	t.Run("after copies", func(t *testing.T) { check(t, withOther) })
	cut := hour.Add(2*time.Hour + 30*time.Minute)
	if _, err := s.PurgeEvents(ctxFor(t), "org_a", cut); err != nil {
		t.Fatalf("PurgeEvents: %v", err)
	}
	var left []events.Event
	for _, ev := range withOther {
		if !ev.CreatedAt.Before(cut) {
			left = append(left, ev)
		}
	}
	t.Run("after a purge through an hour", func(t *testing.T) { check(t, left) })
}

// countEvents is what AggregateEvents must count for q (without percentiles) over events.
func countEvents(q storage.AggregateQuery, events []events.Event) map[string]int64 {
	loc := q.Location
	if loc == nil {
		loc = time.UTC
	}
	out := map[string]int64{}
	for _, ev := range events {
		if ev.OrgID != q.OrgID || (q.ProjectID != "" && ev.ProjectID != q.ProjectID) ||
			(!q.From.IsZero() && ev.CreatedAt.Before(q.From)) || (!q.To.IsZero() && !ev.CreatedAt.Before(q.To)) ||
			(len(q.Severities) > 0 && !slices.Contains(q.Severities, ev.Severity)) {
			continue
		}
		if len(q.Types) > 0 && !slices.ContainsFunc(q.Types, func(p string) bool { return storage.MatchesType(p, ev.Type) }) {
			continue
		}
		var bucket time.Time
		local := ev.CreatedAt.In(loc)
		switch q.Bucket {
		case storage.BucketMinute:
			bucket = ev.CreatedAt.Truncate(time.Minute)
		case storage.BucketHour:
			bucket = time.Date(local.Year(), local.Month(), local.Day(), local.Hour(), 0, 0, 0, loc)
		case storage.BucketDay:
			bucket = time.Date(local.Year(), local.Month(), local.Day(), 0, 0, 0, 0, loc)
		}
		key := map[string]string{storage.GroupType: ev.Type, storage.GroupSeverity: ev.Severity,
			storage.GroupProject: ev.ProjectID, storage.GroupStatus: payloadField(ev, "status")}[q.GroupBy]
		out[bucket.UTC().Format(time.RFC3339)+" "+key]++
	}
	return out
}

func aggregateCounts(rows []storage.AggregateRow) map[string]int64 {
	out := map[string]int64{}
	for _, r := range rows {
		out[r.Bucket.UTC().Format(time.RFC3339)+" "+r.Key] += r.Count
	}
	return out
}

// testEventExport checks that an export streams what paging through every page returns, in
// either order and from a cursor, in chunks of at most storage.ExportChunk, without copies; that
// emit's error stops it; and that a foreign cursor is refused.
func testEventExport(t *testing.T, s storage.EventLog) {
	const n = storage.ExportChunk + 500
	evs := make([]events.Event, n)
	for i := range evs {
		evs[i] = event("org_a", "prj_a", []string{"agent.run_completed", "workflow.completed"}[i%2], time.Duration(i)*time.Second, i)
	}
	mustAppend(t, s, evs)
	mustAppend(t, s, evs[:700]) // re-delivered
	mustAppend(t, s, []events.Event{event("org_a", "prj_b", "agent.run_completed", 0, 1), event("org_b", "prj_a", "agent.run_completed", 0, 2)})
	export := func(t *testing.T, q storage.EventQuery) ([]events.Event, []int) {
		t.Helper()
		var got []events.Event
		var chunks []int
		err := s.ExportEvents(ctxFor(t), q, func(chunk []events.Event) error {
			chunks = append(chunks, len(chunk))
			got = append(got, chunk...)
			return nil
		})
		if err != nil {
			t.Fatalf("ExportEvents(%+v): %v", q, err)
		}
		return got, chunks
	}
	page := func(q storage.EventQuery) []events.Event {
		q.Limit = 1000
		all, _ := queryAll(t, s, q)
		return all
	}
	halfway := newestFirst(evs)[n/2]
	for _, q := range []storage.EventQuery{
		{},
		{Ascending: true},
		{Types: []string{"workflow.*"}, Since: base.Add(100 * time.Second), To: base.Add(1200 * time.Second)},
		{Cursor: storage.EncodeCursor(halfway.CreatedAt, halfway.ID)},
		{Ascending: true, Cursor: storage.EncodeCursor(halfway.CreatedAt, halfway.ID)},
	} {
		q.OrgID, q.ProjectID = "org_a", "prj_a"
		got, chunks := export(t, q)
		want := page(q)
		if !slices.Equal(eventIDs(got), eventIDs(want)) || len(want) == 0 {
			t.Errorf("%+v: exported %d events, paging gives %d (or they differ)", q, len(got), len(want))
		}
		for _, c := range chunks {
			if c < 1 || c > storage.ExportChunk {
				t.Errorf("%+v: a chunk of %d events", q, c)
			}
		}
	}
	got, _ := export(t, storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", Limit: 3, Total: storage.TotalExact})
	if len(got) != n {
		t.Errorf("Limit and Total are not the export's: %d events, want %d", len(got), n)
	}
	for i, ev := range got[:3] {
		if msg := sameEvent(ev, newestFirst(evs)[i]); msg != "" {
			t.Errorf("exported event %d: %s", i, msg)
		}
	}
	stop := errors.New("stop")
	calls := 0
	err := s.ExportEvents(ctxFor(t), storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a"}, func([]events.Event) error {
		calls++
		return stop
	})
	if !errors.Is(err, stop) || calls != 1 {
		t.Errorf("emit's error: %v after %d calls, want it after 1", err, calls)
	}
	err = s.ExportEvents(ctxFor(t), storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", Cursor: "not-a-cursor"},
		func([]events.Event) error { return nil })
	if !errors.Is(err, storage.ErrBadCursor) {
		t.Errorf("foreign cursor: %v, want ErrBadCursor", err)
	}
}

// testEventPagesAcrossTime pages through events whose gaps grow from seconds to weeks, both
// ways and within a range, so that a page spans stretches of time a store may read one after
// the other (ClickHouse reads widening windows from where a page starts).
func testEventPagesAcrossTime(t *testing.T, s storage.EventLog) {
	var evs []events.Event
	offset := time.Duration(0)
	for i := range 40 {
		evs = append(evs, event("org_a", "prj_a", "a.b", offset, i))
		offset += time.Duration(1<<min(i, 22)) * time.Second // up to ~48 days apart
	}
	mustAppend(t, s, evs)
	newest := newestFirst(evs)
	oldest := slices.Clone(newest)
	slices.Reverse(oldest)
	from, to := evs[5].CreatedAt, evs[35].CreatedAt
	var inRange []events.Event
	for _, ev := range newest {
		if !ev.CreatedAt.Before(from) && ev.CreatedAt.Before(to) {
			inRange = append(inRange, ev)
		}
	}
	for _, tt := range []struct {
		name string
		q    storage.EventQuery
		want []events.Event
	}{
		{"newest first", storage.EventQuery{}, newest},
		{"oldest first", storage.EventQuery{Ascending: true}, oldest},
		{"a range", storage.EventQuery{Since: from, To: to}, inRange},
	} {
		tt.q.OrgID, tt.q.ProjectID, tt.q.Limit = "org_a", "prj_a", 7
		got, _ := queryAll(t, s, tt.q)
		if !slices.Equal(eventIDs(got), eventIDs(tt.want)) {
			t.Errorf("%s: got %d events %v, want %d %v", tt.name, len(got), eventIDs(got), len(tt.want), eventIDs(tt.want))
		}
	}
}

// testEventAggregatePrivate checks AggregateQuery.Private: a reader who may not see patient data
// is given neither the status nor the run time of an event that may name a patient, however the
// publisher spelt or escaped the key, but is given those of the open types and of events that
// name no patient.
func testEventAggregatePrivate(t *testing.T, s storage.EventLog) {
	var evs []events.Event
	add := func(typ, payload string) {
		ev := event("org_p", "prj_p", typ, time.Duration(len(evs))*time.Minute, len(evs))
		ev.Payload = json.RawMessage(payload)
		evs = append(evs, ev)
	}
	add("lab.result_noted", `{"patientId":"pat_1","status":"SECRET_1","latencyMs":7}`)
	add("lab.result_noted", `{"Patient_ID":"pat_1","status":"SECRET_2","latencyMs":8}`)
	add("lab.result_noted", `{"\u0070atientId":"pat_1","status":"SECRET_3"}`)
	add("lab.result_noted", `{"note":{"subject":"Patient/pat-1"},"status":"SECRET_4"}`)
	add("diagnostic.result_ready", `{"patientId":"pat_0","status":"SECRET_5"}`)
	add("agent.run_completed", `{"patientId":"pat_1","status":"COMPLETED","latencyMs":100}`)
	add("deployment.status_changed", `{"status":"RUNNING","latencyMs":5}`)
	mustAppend(t, s, evs)
	private := &storage.Private{Types: []string{"agent.run_completed", "diagnostic.result_ready"}, Open: []string{"agent.run_completed"}}
	for _, bucket := range []string{storage.BucketNone, storage.BucketHour} {
		rows, err := s.AggregateEvents(ctxFor(t), storage.AggregateQuery{OrgID: "org_p", GroupBy: storage.GroupStatus, Latency: true,
			Bucket: bucket, Private: private})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string][2]float64{} // count, measured
		for _, r := range rows {
			c := got[r.Key]
			got[r.Key] = [2]float64{c[0] + float64(r.Count), c[1] + float64(r.Measured)}
			if r.Key == storage.RedactedKey && (r.P50 != 0 || r.P99 != 0) {
				t.Errorf("bucket %q: private events measured: %+v", bucket, r)
			}
		}
		want := map[string][2]float64{storage.RedactedKey: {5, 0}, "COMPLETED": {1, 1}, "RUNNING": {1, 1}}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("bucket %q: count, measured per status %v, want %v", bucket, got, want)
		}
	}
	// Groupings that read no payload value are the same with Private.
	rows, err := s.AggregateEvents(ctxFor(t), storage.AggregateQuery{OrgID: "org_p", GroupBy: storage.GroupType, Private: private})
	if err != nil || len(rows) != 4 {
		t.Errorf("per type with Private: %+v, %v; want the 4 types", rows, err)
	}
	// Without Private (a reader who sees every patient) the statuses are as published.
	rows, err = s.AggregateEvents(ctxFor(t), storage.AggregateQuery{OrgID: "org_p", GroupBy: storage.GroupStatus})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 7 {
		t.Errorf("without Private: %+v, want the 7 statuses", rows)
	}
}
