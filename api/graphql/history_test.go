package graphql_test

import (
	"fmt"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// TestEventHistory drives eventHistory and eventStats through the running server: the same
// filters, pages and statistics as GET /v1/events and /v1/events/stats, over the same service.
func TestEventHistory(t *testing.T) {
	s := start(t)
	key := s.DemoKey()
	noScopes := s.Key(demo.DemoOrgSlug, access.Live)
	otherKey := s.Key("northwind-health", access.Live, access.Scopes...)
	sepsis := s.ProjectID(demo.SepsisProjectName)

	day := servertest.AnalystDay
	evs := s.AppendAnalystHistory(demo.DemoOrgID, sepsis)
	rangeVars := func(extra map[string]any) map[string]any {
		v := map[string]any{"p": sepsis, "from": day.Format(time.RFC3339), "to": day.Add(24 * time.Hour).Format(time.RFC3339)}
		for k, x := range extra {
			v[k] = x
		}
		return v
	}
	type page struct {
		EventHistory struct {
			Events []struct {
				ID, Type, Timestamp string
				Redacted            bool
				Payload             map[string]any
			}
			Total          *int
			TotalEstimated bool
			NextCursor     *string
		}
	}
	const history = `query($p: ID!, $from: DateTime, $to: DateTime, $types: [String!], $agent: ID, $patient: ID, $order: EventOrder, $limit: Int, $after: String, $total: EventTotal) {
		eventHistory(projectId: $p, from: $from, to: $to, types: $types, agentId: $agent, patientId: $patient, order: $order, limit: $limit, after: $after, total: $total) {
			events { id type timestamp redacted payload } total totalEstimated nextCursor } }`

	t.Run("keyset pages of one agent's failures, oldest first, without a count", func(t *testing.T) {
		var got []string
		vars := rangeVars(map[string]any{"types": []string{"agent.*"}, "agent": "agt_b", "order": "OLDEST_FIRST", "limit": 4, "total": "NONE"})
		for range 10 {
			var d page
			s.MustGraphQL(t, noScopes, history, vars, &d)
			if d.EventHistory.Total != nil || d.EventHistory.TotalEstimated {
				t.Fatalf("total NONE: %+v", d.EventHistory)
			}
			for _, e := range d.EventHistory.Events {
				got = append(got, e.ID)
			}
			if d.EventHistory.NextCursor == nil {
				break
			}
			vars["after"] = *d.EventHistory.NextCursor
		}
		var want []string
		for i := 1; i < 30; i += 3 {
			want = append(want, evs[i].ID)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("pages gave %v, want agt_b's failures oldest first %v", got, want)
		}
	})

	t.Run("totals exact and estimated; newest first by default", func(t *testing.T) {
		var d page
		s.MustGraphQL(t, noScopes, history, rangeVars(map[string]any{"types": []string{"agent.run_completed", "agent.run.failed"}, "limit": 2}), &d)
		if d.EventHistory.Total == nil || *d.EventHistory.Total != 20 || d.EventHistory.TotalEstimated ||
			len(d.EventHistory.Events) != 2 || d.EventHistory.Events[0].ID != evs[28].ID {
			t.Fatalf("exact: %+v", d.EventHistory)
		}
		s.MustGraphQL(t, noScopes, history, rangeVars(map[string]any{"total": "ESTIMATE", "limit": 1}), &d)
		if d.EventHistory.Total == nil || !d.EventHistory.TotalEstimated {
			t.Fatalf("estimate: %+v", d.EventHistory)
		}
	})

	t.Run("patient data: the filter needs read:patients, and payloads are redacted without it", func(t *testing.T) {
		fails(t, s, noScopes, history, rangeVars(map[string]any{"patient": demo.RealPatientID}), "FORBIDDEN")
		var d page
		s.MustGraphQL(t, key, history, rangeVars(map[string]any{"patient": demo.RealPatientID, "limit": 100}), &d)
		if len(d.EventHistory.Events) != 10 || d.EventHistory.Events[0].Redacted {
			t.Fatalf("a patient's events with read:patients: %+v", d.EventHistory)
		}
		var redacted page
		s.MustGraphQL(t, noScopes, history, rangeVars(map[string]any{"types": []string{"device.*"}, "limit": 1}), &redacted)
		if e := redacted.EventHistory.Events; len(e) != 1 || !e[0].Redacted || e[0].Payload["patientId"] != nil {
			t.Fatalf("without read:patients the payload is redacted: %+v", redacted.EventHistory)
		}
	})

	t.Run("refusals", func(t *testing.T) {
		fails(t, s, noScopes, history, rangeVars(map[string]any{"after": "not-a-cursor"}), "BAD_USER_INPUT")
		fails(t, s, noScopes, history, rangeVars(map[string]any{"types": []string{"Agent!"}}), "BAD_USER_INPUT")
		fails(t, s, noScopes, history, rangeVars(map[string]any{"limit": 101}), "BAD_USER_INPUT")
		fails(t, s, noScopes, history, rangeVars(map[string]any{"from": day.Add(time.Hour).Format(time.RFC3339), "to": day.Format(time.RFC3339)}), "BAD_USER_INPUT")
		fails(t, s, otherKey, history, rangeVars(nil), "NOT_FOUND")
	})

	type stats struct {
		EventStats []struct {
			Bucket        *string
			Key           string
			Count         int
			Rate          float64
			Measured      *int
			P50, P90, P99 *float64
		}
	}
	const statsQuery = `query($p: ID, $from: DateTime!, $to: DateTime, $bucket: StatsBucket, $tz: String, $group: StatsGroup, $types: [String!], $latency: Boolean, $top: Int) {
		eventStats(projectId: $p, from: $from, to: $to, bucket: $bucket, timeZone: $tz, groupBy: $group, types: $types, latency: $latency, top: $top) {
			bucket key count rate measured p50 p90 p99 } }`

	t.Run("stats: counts and rates per type, top-N", func(t *testing.T) {
		var d stats
		s.MustGraphQL(t, noScopes, statsQuery, rangeVars(map[string]any{"group": "TYPE"}), &d)
		if len(d.EventStats) != 3 {
			t.Fatalf("per type: %+v", d.EventStats)
		}
		for _, r := range d.EventStats {
			if r.Count != 10 || r.Bucket != nil || r.Measured != nil || r.Rate < 0.33 || r.Rate > 0.34 {
				t.Fatalf("per type: %+v", d.EventStats)
			}
		}
		s.MustGraphQL(t, noScopes, statsQuery, rangeVars(map[string]any{"group": "SEVERITY", "top": 1}), &d)
		if len(d.EventStats) != 1 || d.EventStats[0].Key != "info" || d.EventStats[0].Count != 20 {
			t.Fatalf("top severity: %+v", d.EventStats)
		}
	})

	t.Run("stats: per hour in a time zone, with latency percentiles", func(t *testing.T) {
		var d stats
		s.MustGraphQL(t, noScopes, statsQuery, rangeVars(map[string]any{"bucket": "HOUR", "tz": "Asia/Kolkata", "types": []string{"agent.*"},
			"group": "STATUS", "latency": true}), &d)
		if len(d.EventStats) == 0 {
			t.Fatal("no rows")
		}
		total := 0
		for _, r := range d.EventStats {
			b, err := time.Parse(time.RFC3339, *r.Bucket)
			if err != nil || b.Minute() != 30 { // Kolkata hours start at :30 UTC
				t.Fatalf("bucket %v (%v) does not start a Kolkata hour", *r.Bucket, err)
			}
			if r.Measured == nil || *r.Measured != r.Count || r.P50 == nil || r.P99 == nil {
				t.Fatalf("latency row: %+v", r)
			}
			total += r.Count
		}
		if total != 20 {
			t.Fatalf("agent events over the hours: %d, want 20", total)
		}
	})

	t.Run("stats refusals", func(t *testing.T) {
		fails(t, s, noScopes, statsQuery, rangeVars(map[string]any{"tz": "Mars/Olympus"}), "BAD_USER_INPUT")
		fails(t, s, noScopes, statsQuery, rangeVars(map[string]any{"bucket": "HOUR", "top": 3}), "BAD_USER_INPUT")
		fails(t, s, noScopes, statsQuery, rangeVars(map[string]any{"bucket": "MINUTE", "from": "2019-01-01T00:00:00Z"}), "BAD_USER_INPUT")
		fails(t, s, otherKey, statsQuery, rangeVars(nil), "NOT_FOUND")
	})
}
