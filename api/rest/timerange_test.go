package rest_test

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// Every route with a time range takes from (inclusive) and to (exclusive), and since as from's
// other name (DECISIONS §8): a query copied from GET /v1/events to GET /v1/events/stats, or back,
// means the same. Both names given must agree.
func TestTimeRangeNames(t *testing.T) {
	s, key, project, evs := analyst(t)
	mid := day.Add(150 * time.Minute) // the history is 30 events, 10 minutes apart
	want := 0
	for _, ev := range evs {
		if !ev.CreatedAt.Before(mid) && ev.CreatedAt.Before(day.Add(24*time.Hour)) {
			want++
		}
	}
	if want == 0 || want == len(evs) {
		t.Fatalf("%d of %d events after %v: the test needs a range that cuts the history", want, len(evs), mid)
	}
	to := "&to=" + day.Add(24*time.Hour).Format(time.RFC3339)
	at := mid.Format(time.RFC3339)

	t.Run("GET /v1/events", func(t *testing.T) {
		for _, start := range []string{"from=" + at, "since=" + at, "from=" + at + "&since=" + at} {
			var p eventsPage
			r := s.Do(http.MethodGet, "/v1/events?projectId="+project+"&"+start+to, key, nil)
			r.JSON(t, &p)
			if r.Status != http.StatusOK || p.Meta["total"] != float64(want) {
				t.Errorf("%s: HTTP %d, total %v, want %d: %s", start, r.Status, p.Meta["total"], want, r.Body)
			}
		}
		e := wantError(t, s.Do(http.MethodGet, "/v1/events?projectId="+project+"&from="+at+"&since="+day.Format(time.RFC3339), key, nil),
			http.StatusBadRequest, "INVALID_REQUEST")
		if !strings.Contains(e.Error.Message, "since is a synonym of from") {
			t.Errorf("message %q does not say why", e.Error.Message)
		}
	})
	t.Run("GET /v1/events/export", func(t *testing.T) {
		_, body := raw(t, s, "/v1/events/export?projectId="+project+"&from="+at+to, key, nil)
		if n := len(ndjsonLines(t, body)); n != want {
			t.Errorf("export from=: %d lines, want %d", n, want)
		}
	})
	t.Run("GET /v1/events/stats", func(t *testing.T) {
		for _, start := range []string{"from=" + at, "since=" + at} {
			r := s.Do(http.MethodGet, "/v1/events/stats?projectId="+project+"&"+start+to, key, nil)
			var out struct{ Data []struct{ Count int64 } }
			r.JSON(t, &out)
			if r.Status != http.StatusOK || len(out.Data) != 1 || out.Data[0].Count != int64(want) {
				t.Errorf("%s: HTTP %d %s, want one row of %d", start, r.Status, r.Body, want)
			}
		}
		wantError(t, s.Do(http.MethodGet, "/v1/events/stats?projectId="+project+"&from="+at+"&since="+day.Format(time.RFC3339), key, nil),
			http.StatusBadRequest, "INVALID_REQUEST")
	})
	t.Run("GraphQL events and eventHistory", func(t *testing.T) {
		var out struct {
			Events       []struct{ ID string }
			EventHistory struct{ Total int }
		}
		s.MustGraphQL(t, key, `query($p: ID!, $from: DateTime!, $to: DateTime!) {
			events(projectId: $p, from: $from, to: $to, limit: 100) { id }
			eventHistory(projectId: $p, since: $from, to: $to) { total }
		}`, map[string]any{"p": project, "from": at, "to": day.Add(24 * time.Hour).Format(time.RFC3339)}, &out)
		if len(out.Events) != min(want, 100) || out.EventHistory.Total != want {
			t.Errorf("events(from:) %d, eventHistory(since:) total %d; want %d", len(out.Events), out.EventHistory.Total, want)
		}
		res := s.GraphQL(key, `query($p: ID!) { events(projectId: $p, from: "`+at+`", since: "`+day.Format(time.RFC3339)+`") { id } }`,
			map[string]any{"p": project})
		if len(res.Errors) != 1 || !strings.Contains(res.Errors[0].Message, "since is a synonym of from") {
			t.Errorf("events with disagreeing from and since: %+v", res.Errors)
		}
	})
}
