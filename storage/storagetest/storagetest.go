// Package storagetest holds the conformance suites that every implementation of the storage
// contracts must pass: TestEventLog for storage.EventLog and TestAuditLog for storage.AuditLog.
// An implementation's tests call them with a constructor that returns an empty store of its own
// for each subtest:
//
//	func TestEventLog(t *testing.T) {
//		storagetest.TestEventLog(t, func(t *testing.T) storage.EventLog {
//			return postgres.NewEventLog(pgtest.New(t))
//		})
//	}
//
// The suites pin down the semantics the contracts leave to prose: idempotency by id, newest-first
// order with ties broken by id, inclusive Since and From, exclusive To, Total counting every
// match, cursors that visit each match exactly once, storage.ErrBadCursor, and tenant isolation.
// Times are compared at microsecond precision (the precision of both stores) and payloads as
// JSON values, not bytes (Postgres jsonb normalizes them).
package storagetest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"carehub/kernel/events"
	"carehub/kernel/ids"
	"carehub/storage"
)

// base is the creation time the suites build their events around: fixed, in the past, and with
// a microsecond part, so a store that rounds or truncates differently shows up.
var base = time.Date(2025, 3, 14, 9, 26, 53, 589793000, time.UTC)

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// event returns an event of org/project created at base+offset, with a payload that names it.
func event(org, project, typ string, offset time.Duration, n int) events.Event {
	return events.Event{
		ID:        ids.New(ids.Event),
		Type:      typ,
		OrgID:     org,
		ProjectID: project,
		Source:    "system",
		Severity:  "info",
		Payload:   json.RawMessage(fmt.Sprintf(`{"n": %d, "nested": {"b": [1, 2.5, "x"], "a": null}, "ok": true}`, n)),
		CreatedAt: base.Add(offset),
	}
}

// newestFirst sorts evs as QueryEvents must return them.
func newestFirst(evs []events.Event) []events.Event {
	out := slices.Clone(evs)
	slices.SortFunc(out, func(a, b events.Event) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	return out
}

func eventIDs(evs []events.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.ID
	}
	return out
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// sameEvent reports how got differs from want, or "".
func sameEvent(got, want events.Event) string {
	switch {
	case got.ID != want.ID, got.Type != want.Type, got.OrgID != want.OrgID, got.ProjectID != want.ProjectID,
		got.Source != want.Source, got.Severity != want.Severity:
		return fmt.Sprintf("got %+v, want %+v", got, want)
	case !got.CreatedAt.Equal(want.CreatedAt.Truncate(time.Microsecond)):
		return fmt.Sprintf("%s: createdAt %s, want %s", want.ID, got.CreatedAt.Format(time.RFC3339Nano), want.CreatedAt.Format(time.RFC3339Nano))
	case got.CreatedAt.Location() != time.UTC:
		return fmt.Sprintf("%s: createdAt in %s, want UTC", want.ID, got.CreatedAt.Location())
	case !jsonEqual(got.Payload, want.Payload):
		return fmt.Sprintf("%s: payload %s, want %s", want.ID, got.Payload, want.Payload)
	}
	return ""
}

// TestEventLog runs the storage.EventLog conformance suite. newStore returns an empty store for
// one subtest; it may use t.Cleanup and t.Skip.
func TestEventLog(t *testing.T, newStore func(t *testing.T) storage.EventLog) {
	t.Run("RoundTrip", func(t *testing.T) { testEventRoundTrip(t, newStore(t)) })
	t.Run("IdempotentAppend", func(t *testing.T) { testEventIdempotent(t, newStore(t)) })
	t.Run("NewestFirstTiesByID", func(t *testing.T) { testEventOrder(t, newStore(t)) })
	t.Run("Filters", func(t *testing.T) { testEventFilters(t, newStore(t)) })
	t.Run("CursorVisitsEachOnce", func(t *testing.T) { testEventPaging(t, newStore(t)) })
	t.Run("BadCursor", func(t *testing.T) { testEventBadCursor(t, newStore(t)) })
	t.Run("TenantIsolation", func(t *testing.T) { testEventTenants(t, newStore(t)) })
	t.Run("LargeBatch", func(t *testing.T) { testEventLargeBatch(t, newStore(t)) })
	t.Run("Concurrent", func(t *testing.T) { testEventConcurrent(t, newStore(t)) })
	t.Run("RangesPatternsResources", func(t *testing.T) { testEventRangesAndPatterns(t, newStore(t)) })
	t.Run("AscendingTies", func(t *testing.T) { testEventAscendingTies(t, newStore(t)) })
	t.Run("TotalModes", func(t *testing.T) { testEventTotalModes(t, newStore(t)) })
	t.Run("Aggregate", func(t *testing.T) { testEventAggregate(t, newStore(t)) })
	t.Run("AggregatePaths", func(t *testing.T) { testEventAggregatePaths(t, newStore(t)) })
	t.Run("AggregatePrivate", func(t *testing.T) { testEventAggregatePrivate(t, newStore(t)) })
	t.Run("Export", func(t *testing.T) { testEventExport(t, newStore(t)) })
	t.Run("PagesAcrossTime", func(t *testing.T) { testEventPagesAcrossTime(t, newStore(t)) })
	t.Run("Purge", func(t *testing.T) { testEventPurge(t, newStore(t)) })
	t.Run("HostilePayloads", func(t *testing.T) { testEventHostilePayloads(t, newStore(t)) })
}

func mustAppend(t *testing.T, s storage.EventLog, evs []events.Event) {
	t.Helper()
	if err := s.AppendEvents(ctxFor(t), evs); err != nil {
		t.Fatalf("AppendEvents: %v", err)
	}
}

func mustQuery(t *testing.T, s storage.EventLog, q storage.EventQuery) storage.EventPage {
	t.Helper()
	page, err := s.QueryEvents(ctxFor(t), q)
	if err != nil {
		t.Fatalf("QueryEvents(%+v): %v", q, err)
	}
	return page
}

// queryAll follows cursors from the first page to the last and returns every event seen.
func queryAll(t *testing.T, s storage.EventLog, q storage.EventQuery) ([]events.Event, int) {
	t.Helper()
	return pageAll(t, q.Limit, q.Cursor, func(cursor string) ([]events.Event, string) {
		q.Cursor = cursor
		page := mustQuery(t, s, q)
		return page.Events, page.NextCursor
	})
}

// pageAll follows cursors from cursor to the last page, read by page (its items and the next
// cursor), and returns every item and the number of pages. A page larger than limit (when set)
// or a cursor that does not progress fails the test.
func pageAll[T any](t *testing.T, limit int, cursor string, page func(cursor string) ([]T, string)) ([]T, int) {
	t.Helper()
	var all []T
	for pages := 1; ; pages++ {
		items, next := page(cursor)
		if len(items) > limit && limit > 0 {
			t.Fatalf("page of %d items for limit %d", len(items), limit)
		}
		all = append(all, items...)
		if next == "" {
			return all, pages
		}
		if len(items) == 0 || pages > 10_000 {
			t.Fatal("cursor does not progress")
		}
		cursor = next
	}
}

// where returns the items of list that keep keeps, in order.
func where[T any](list []T, keep func(T) bool) []T {
	var out []T
	for _, v := range list {
		if keep(v) {
			out = append(out, v)
		}
	}
	return out
}

func testEventRoundTrip(t *testing.T, s storage.EventLog) {
	evs := []events.Event{
		event("org_a", "prj_a", "deployment.status_changed", 0, 1),
		event("org_a", "prj_a", "agent.run.failed", time.Second, 2),
	}
	evs[1].Source, evs[1].Severity = "agent", "critical"
	// Sub-microsecond digits are dropped by every store; equality is checked at microseconds.
	evs[1].CreatedAt = evs[1].CreatedAt.Add(789 * time.Nanosecond)
	evs[1].Payload = json.RawMessage(`{"text": "ünïcødé \"quoted\" \\ <tag> &", "big": 12345678901234, "neg": -0.125, "list": []}`)
	mustAppend(t, s, evs)

	page := mustQuery(t, s, storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", Limit: 10})
	if len(page.Events) != 2 || page.Total != 2 || page.NextCursor != "" {
		t.Fatalf("got %d events, total %d, cursor %q; want 2, 2, none", len(page.Events), page.Total, page.NextCursor)
	}
	for i, want := range []events.Event{evs[1], evs[0]} {
		if diff := sameEvent(page.Events[i], want); diff != "" {
			t.Error(diff)
		}
	}
	if err := s.AppendEvents(ctxFor(t), nil); err != nil {
		t.Errorf("AppendEvents(nil): %v", err)
	}
}

func testEventIdempotent(t *testing.T, s storage.EventLog) {
	var evs []events.Event
	for i := range 20 {
		evs = append(evs, event("org_a", "prj_a", "a.b", time.Duration(i)*time.Millisecond, i))
	}
	mustAppend(t, s, evs[:10])
	mustAppend(t, s, evs[:10]) // the same batch again: a re-delivered Kafka batch
	mustAppend(t, s, evs[5:])  // overlapping
	// Duplicates within one batch, and a copy whose payload differs: still one event. Which
	// copy survives is unspecified (Postgres keeps the first, ClickHouse the last); an event id
	// names one immutable envelope, so real copies are identical.
	changed := evs[0]
	changed.Payload = json.RawMessage(`{"changed": true}`)
	mustAppend(t, s, []events.Event{evs[19], evs[19], changed})

	got, _ := queryAll(t, s, storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", Limit: 7})
	want := newestFirst(evs)
	if !slices.Equal(eventIDs(got), eventIDs(want)) {
		t.Fatalf("stored ids %v, want each of %v once", eventIDs(got), eventIDs(want))
	}
	if diff := sameEvent(got[len(got)-2], evs[1]); diff != "" {
		t.Errorf("re-appends changed an event: %s", diff)
	}
	if total := mustQuery(t, s, storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", Limit: 1}).Total; total != 20 {
		t.Errorf("total %d after re-appends, want 20", total)
	}
}

func testEventOrder(t *testing.T, s storage.EventLog) {
	var evs []events.Event
	// Three events share each timestamp; appended in an order unrelated to the expected one.
	for i := range 12 {
		evs = append(evs, event("org_a", "prj_a", "a.b", time.Duration(i%4)*time.Second, i))
	}
	shuffled := slices.Clone(evs)
	slices.Reverse(shuffled[3:])
	mustAppend(t, s, shuffled[:5])
	mustAppend(t, s, shuffled[5:])

	page := mustQuery(t, s, storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", Limit: 100})
	want := newestFirst(evs)
	if !slices.Equal(eventIDs(page.Events), eventIDs(want)) {
		t.Fatalf("order %v, want %v (created_at desc, id desc)", eventIDs(page.Events), eventIDs(want))
	}
}

func testEventFilters(t *testing.T, s storage.EventLog) {
	var evs []events.Event
	types := []string{"agent.run_completed", "agent.run.failed", "workflow.completed"}
	for i := range 30 {
		evs = append(evs, event("org_a", "prj_a", types[i%3], time.Duration(i)*time.Minute, i))
	}
	evs = append(evs, event("org_a", "prj_other", "agent.run_completed", time.Hour, 99))
	mustAppend(t, s, evs)
	inProject := evs[:30]

	filter := func(keep func(events.Event) bool) []events.Event { return newestFirst(where(inProject, keep)) }
	since := base.Add(10 * time.Minute) // exactly the 11th event's time: Since is inclusive
	tests := []struct {
		name string
		q    storage.EventQuery
		want []events.Event
	}{
		{"project", storage.EventQuery{}, filter(func(events.Event) bool { return true })},
		{"type", storage.EventQuery{Type: "agent.run.failed"}, filter(func(e events.Event) bool { return e.Type == "agent.run.failed" })},
		{"type is exact, not a prefix", storage.EventQuery{Type: "agent.run"}, nil},
		{"since inclusive", storage.EventQuery{Since: since}, filter(func(e events.Event) bool { return !e.CreatedAt.Before(since) })},
		{"since and type", storage.EventQuery{Since: since, Type: "workflow.completed"},
			filter(func(e events.Event) bool { return !e.CreatedAt.Before(since) && e.Type == "workflow.completed" })},
		{"since in the future", storage.EventQuery{Since: base.Add(24 * time.Hour)}, nil},
		{"unknown project", storage.EventQuery{ProjectID: "prj_none"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := tt.q
			q.OrgID = "org_a"
			if q.ProjectID == "" {
				q.ProjectID = "prj_a"
			}
			for _, limit := range []int{1000, 4} {
				q.Limit = limit
				page := mustQuery(t, s, q)
				if page.Total != int64(len(tt.want)) {
					t.Errorf("limit %d: total %d, want %d (every match, not the page)", limit, page.Total, len(tt.want))
				}
				n := min(limit, len(tt.want))
				if !slices.Equal(eventIDs(page.Events), eventIDs(tt.want[:n])) {
					t.Errorf("limit %d: got %v, want %v", limit, eventIDs(page.Events), eventIDs(tt.want[:n]))
				}
				if (page.NextCursor != "") != (len(tt.want) > limit) {
					t.Errorf("limit %d: next cursor %q with %d matches", limit, page.NextCursor, len(tt.want))
				}
			}
		})
	}
}

func testEventPaging(t *testing.T, s storage.EventLog) {
	var evs []events.Event
	// 103 events in runs of up to 7 sharing a timestamp, so pages break inside ties.
	for i := range 103 {
		evs = append(evs, event("org_a", "prj_a", []string{"x.y", "x.z"}[i%2], time.Duration(i/7)*time.Second, i))
	}
	mustAppend(t, s, evs)
	for _, limit := range []int{1, 5, 7, 10, 103, 500} {
		for _, typ := range []string{"", "x.z"} {
			t.Run(fmt.Sprintf("limit %d type %q", limit, typ), func(t *testing.T) {
				want := evs
				if typ != "" {
					want = nil
					for _, ev := range evs {
						if ev.Type == typ {
							want = append(want, ev)
						}
					}
				}
				got, pages := queryAll(t, s, storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", Type: typ, Limit: limit})
				if !slices.Equal(eventIDs(got), eventIDs(newestFirst(want))) {
					t.Fatalf("paging visited %d events %v, want each of %d once in order", len(got), eventIDs(got), len(want))
				}
				if wantPages := max(1, (len(want)+limit-1)/limit); pages != wantPages {
					t.Errorf("%d pages, want %d", pages, wantPages)
				}
			})
		}
	}

	// A cursor stays valid while new events arrive: they are newer, so they do not shift the
	// pages after it.
	first := mustQuery(t, s, storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", Limit: 50})
	mustAppend(t, s, []events.Event{event("org_a", "prj_a", "x.y", time.Hour, 1000)})
	rest, _ := queryAll(t, s, storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", Limit: 50, Cursor: first.NextCursor})
	if got := append(eventIDs(first.Events), eventIDs(rest)...); !slices.Equal(got, eventIDs(newestFirst(evs))) {
		t.Errorf("pages across a concurrent append: %d events, want the original %d", len(got), len(evs))
	}
}

func testEventBadCursor(t *testing.T, s storage.EventLog) {
	mustAppend(t, s, []events.Event{event("org_a", "prj_a", "a.b", 0, 0), event("org_a", "prj_a", "a.b", 1, 1)})
	for _, cursor := range []string{
		"garbage!",
		"bm90IGEgY3Vyc29y", // "not a cursor"
		base64.RawURLEncoding.EncodeToString([]byte("9.1.evt_x")),
		base64.StdEncoding.EncodeToString([]byte{0xff, 0xfe, 0x00}),
	} {
		_, err := s.QueryEvents(ctxFor(t), storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", Limit: 1, Cursor: cursor})
		if !errors.Is(err, storage.ErrBadCursor) {
			t.Errorf("cursor %q: err = %v, want storage.ErrBadCursor", cursor, err)
		}
	}
}

func testEventTenants(t *testing.T, s storage.EventLog) {
	a := []events.Event{event("org_a", "prj_a", "a.b", 0, 0), event("org_a", "prj_a", "a.b", time.Second, 1)}
	b := []events.Event{event("org_b", "prj_b", "a.b", 0, 2)}
	// An event claiming another organization's project must stay invisible to both owners'
	// queries of the wrong organization.
	forged := event("org_b", "prj_a", "a.b", 2*time.Second, 3)
	mustAppend(t, s, append(append(a, b...), forged))

	tests := []struct {
		name      string
		org, proj string
		want      []events.Event
	}{
		{"own project", "org_a", "prj_a", newestFirst(a)},
		{"other org's project", "org_a", "prj_b", nil},
		{"other org in own project", "org_b", "prj_a", []events.Event{forged}},
		{"org b", "org_b", "prj_b", b},
		{"operator sees every org", "", "prj_a", newestFirst(append(slices.Clone(a), forged))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page := mustQuery(t, s, storage.EventQuery{OrgID: tt.org, ProjectID: tt.proj, Limit: 100})
			if !slices.Equal(eventIDs(page.Events), eventIDs(tt.want)) || page.Total != int64(len(tt.want)) {
				t.Errorf("got %v (total %d), want %v", eventIDs(page.Events), page.Total, eventIDs(tt.want))
			}
		})
	}
}

func testEventLargeBatch(t *testing.T, s storage.EventLog) {
	const n = 5000 // a writer batch: large enough for an implementation's bulk path
	evs := make([]events.Event, n)
	for i := range evs {
		evs[i] = event("org_a", "prj_a", "a.b", time.Duration(i)*time.Microsecond, i)
	}
	mustAppend(t, s, evs)
	mustAppend(t, s, evs[n/2:]) // half re-delivered
	page := mustQuery(t, s, storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", Limit: 3})
	if page.Total != n {
		t.Fatalf("total %d, want %d", page.Total, n)
	}
	if want := newestFirst(evs)[:3]; !slices.Equal(eventIDs(page.Events), eventIDs(want)) {
		t.Errorf("newest %v, want %v", eventIDs(page.Events), eventIDs(want))
	}
}

func testEventConcurrent(t *testing.T, s storage.EventLog) {
	// Writers that race on the same ids (two consumers after a rebalance) still leave one copy.
	evs := make([]events.Event, 200)
	for i := range evs {
		evs[i] = event("org_a", "prj_a", "a.b", time.Duration(i)*time.Millisecond, i)
	}
	errs := make(chan error, 4)
	for w := range 4 {
		go func() {
			batch := slices.Clone(evs)
			if w%2 == 1 {
				slices.Reverse(batch)
			}
			errs <- s.AppendEvents(ctxFor(t), batch)
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent AppendEvents: %v", err)
		}
	}
	if total := mustQuery(t, s, storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", Limit: 1}).Total; total != int64(len(evs)) {
		t.Errorf("total %d after concurrent appends, want %d", total, len(evs))
	}
}
