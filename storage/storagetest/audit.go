package storagetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"carehub/kernel/ids"
	"carehub/storage"
)

// TestAuditLog runs the storage.AuditLog conformance suite. newStore returns an empty store for
// one subtest; it may use t.Cleanup and t.Skip.
func TestAuditLog(t *testing.T, newStore func(t *testing.T) storage.AuditLog) {
	t.Run("RoundTrip", func(t *testing.T) { testAuditRoundTrip(t, newStore(t)) })
	t.Run("IdempotentAppend", func(t *testing.T) { testAuditIdempotent(t, newStore(t)) })
	t.Run("Filters", func(t *testing.T) { testAuditFilters(t, newStore(t)) })
	t.Run("CursorVisitsEachOnce", func(t *testing.T) { testAuditPaging(t, newStore(t)) })
	t.Run("BadCursor", func(t *testing.T) { testAuditBadCursor(t, newStore(t)) })
	t.Run("Purge", func(t *testing.T) { testAuditPurge(t, newStore(t)) })
}

func record(org, key, op string, offset time.Duration, patients ...string) storage.AuditRecord {
	return storage.AuditRecord{
		ID:          ids.New(ids.Request),
		Time:        base.Add(offset),
		OrgID:       org,
		KeyID:       key,
		Mode:        "live",
		ClientIP:    "203.0.113.7",
		UserAgent:   "carehub-test/1.0",
		Operation:   op,
		ResourceIDs: append([]string{"obs_1"}, patients...),
		PatientIDs:  patients,
		Outcome:     "success",
		Status:      200,
		LatencyMs:   int(offset / time.Millisecond % 1000),
	}
}

func recordIDs(rs []storage.AuditRecord) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

func newestRecordsFirst(rs []storage.AuditRecord) []storage.AuditRecord {
	out := slices.Clone(rs)
	slices.SortFunc(out, func(a, b storage.AuditRecord) int {
		if c := b.Time.Compare(a.Time); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	return out
}

// sameRecord reports how got differs from want, or "". Nil and empty id lists are equal.
func sameRecord(got, want storage.AuditRecord) string {
	g := []any{got.ID, got.OrgID, got.KeyID, got.Mode, got.ClientIP, got.UserAgent, got.Operation, got.Outcome, got.Status, got.LatencyMs,
		got.Truncated, got.PatientIDsOmitted, got.ResourceIDsOmitted, got.AuthFailure, got.Credential}
	w := []any{want.ID, want.OrgID, want.KeyID, want.Mode, want.ClientIP, want.UserAgent, want.Operation, want.Outcome, want.Status, want.LatencyMs,
		want.Truncated, want.PatientIDsOmitted, want.ResourceIDsOmitted, want.AuthFailure, want.Credential}
	switch {
	case !slices.Equal(g, w):
		return fmt.Sprintf("got %+v, want %+v", got, want)
	case !got.Time.Equal(want.Time.Truncate(time.Microsecond)) || got.Time.Location() != time.UTC:
		return fmt.Sprintf("%s: time %s, want %s in UTC", want.ID, got.Time.Format(time.RFC3339Nano), want.Time.Format(time.RFC3339Nano))
	case !slices.Equal(got.ResourceIDs, want.ResourceIDs) && len(got.ResourceIDs)+len(want.ResourceIDs) > 0:
		return fmt.Sprintf("%s: resource ids %v, want %v", want.ID, got.ResourceIDs, want.ResourceIDs)
	case !slices.Equal(got.PatientIDs, want.PatientIDs) && len(got.PatientIDs)+len(want.PatientIDs) > 0:
		return fmt.Sprintf("%s: patient ids %v, want %v", want.ID, got.PatientIDs, want.PatientIDs)
	}
	return ""
}

func mustAppendAudit(t *testing.T, s storage.AuditLog, rs []storage.AuditRecord) {
	t.Helper()
	if err := s.AppendAudit(ctxFor(t), rs); err != nil {
		t.Fatalf("AppendAudit: %v", err)
	}
}

func mustQueryAudit(t *testing.T, s storage.AuditLog, q storage.AuditQuery) storage.AuditPage {
	t.Helper()
	page, err := s.QueryAudit(ctxFor(t), q)
	if err != nil {
		t.Fatalf("QueryAudit(%+v): %v", q, err)
	}
	return page
}

func queryAllAudit(t *testing.T, s storage.AuditLog, q storage.AuditQuery) []storage.AuditRecord {
	t.Helper()
	all, _ := pageAll(t, q.Limit, q.Cursor, func(cursor string) ([]storage.AuditRecord, string) {
		q.Cursor = cursor
		page := mustQueryAudit(t, s, q)
		return page.Records, page.NextCursor
	})
	return all
}

func testAuditRoundTrip(t *testing.T, s storage.AuditLog) {
	full := record("org_a", "key_1", "GET /v1/patients/{id}", 0, "pat_1", "pat_2")
	full.Time = full.Time.Add(123 * time.Nanosecond) // dropped: microsecond precision
	// A record that says it is incomplete: more ids were touched than a record keeps.
	full.Truncated, full.PatientIDsOmitted, full.ResourceIDsOmitted = true, 250, 40
	// Ids are text to the store, whatever they hold: an id list must come back as it went in.
	full.ResourceIDs = append(full.ResourceIDs, `q"uote`, `back\slash`, "com,ma", "{brace}", "NULL", "", "é ü", ` `)
	empty := record("", "key_platform", "graphql query organizations", time.Second)
	empty.ResourceIDs, empty.PatientIDs = nil, nil
	empty.Mode, empty.Outcome, empty.Status, empty.LatencyMs = "test", "denied", 403, 0
	// A refused credential: no key, no organization, no mode.
	refused := record("", "", "GET /v1/patients/{id}", 2*time.Second)
	refused.ResourceIDs, refused.Mode, refused.Outcome, refused.Status = nil, "", "denied", 401
	refused.AuthFailure, refused.Credential = "unknown_key", "chk_live_…AbCd"
	mustAppendAudit(t, s, []storage.AuditRecord{full, empty, refused})
	if err := s.AppendAudit(ctxFor(t), nil); err != nil {
		t.Errorf("AppendAudit(nil): %v", err)
	}

	page := mustQueryAudit(t, s, storage.AuditQuery{Limit: 10})
	if len(page.Records) != 3 || page.Total != 3 {
		t.Fatalf("got %d records, total %d; want 3", len(page.Records), page.Total)
	}
	for i, want := range []storage.AuditRecord{refused, empty, full} {
		if diff := sameRecord(page.Records[i], want); diff != "" {
			t.Error(diff)
		}
	}
}

func testAuditIdempotent(t *testing.T, s storage.AuditLog) {
	var rs []storage.AuditRecord
	for i := range 30 {
		rs = append(rs, record("org_a", "key_1", "GET /v1/events", time.Duration(i)*time.Second))
	}
	mustAppendAudit(t, s, rs[:20])
	mustAppendAudit(t, s, rs[10:])
	mustAppendAudit(t, s, []storage.AuditRecord{rs[0], rs[0], rs[29]})
	got := queryAllAudit(t, s, storage.AuditQuery{OrgID: "org_a", Limit: 8})
	if want := newestRecordsFirst(rs); !slices.Equal(recordIDs(got), recordIDs(want)) {
		t.Fatalf("stored %d records %v, want each of %d once", len(got), recordIDs(got), len(want))
	}
	if total := mustQueryAudit(t, s, storage.AuditQuery{OrgID: "org_a", Limit: 1}).Total; total != 30 {
		t.Errorf("total %d, want 30", total)
	}
}

func testAuditFilters(t *testing.T, s storage.AuditLog) {
	ops := []string{"GET /v1/patients/{id}", "GET /v1/events", "graphql query patient"}
	var rs []storage.AuditRecord
	for i := range 36 {
		org := []string{"org_a", "org_b"}[i%2]
		key := fmt.Sprintf("key_%s_%d", org, i%3)
		var patients []string
		if i%5 == 0 {
			patients = []string{"pat_x", fmt.Sprintf("pat_%d", i)}
		} else if i%5 == 1 {
			patients = []string{fmt.Sprintf("pat_%d", i)}
		}
		rs = append(rs, record(org, key, ops[i%3], time.Duration(i)*time.Minute, patients...))
	}
	mustAppendAudit(t, s, rs)

	from, to := base.Add(6*time.Minute), base.Add(30*time.Minute) // [from, to)
	match := func(keep func(storage.AuditRecord) bool) []storage.AuditRecord {
		return newestRecordsFirst(where(rs, keep))
	}
	tests := []struct {
		name string
		q    storage.AuditQuery
		want []storage.AuditRecord
	}{
		{"everything (operator)", storage.AuditQuery{}, match(func(storage.AuditRecord) bool { return true })},
		{"org", storage.AuditQuery{OrgID: "org_a"}, match(func(r storage.AuditRecord) bool { return r.OrgID == "org_a" })},
		{"time range [from, to)", storage.AuditQuery{OrgID: "org_a", From: from, To: to},
			match(func(r storage.AuditRecord) bool {
				return r.OrgID == "org_a" && !r.Time.Before(from) && r.Time.Before(to)
			})},
		{"from only", storage.AuditQuery{From: to}, match(func(r storage.AuditRecord) bool { return !r.Time.Before(to) })},
		{"to only", storage.AuditQuery{To: from}, match(func(r storage.AuditRecord) bool { return r.Time.Before(from) })},
		{"key", storage.AuditQuery{KeyID: "key_org_b_1"}, match(func(r storage.AuditRecord) bool { return r.KeyID == "key_org_b_1" })},
		{"key of another org", storage.AuditQuery{OrgID: "org_a", KeyID: "key_org_b_1"}, nil},
		{"patient", storage.AuditQuery{PatientID: "pat_x"}, match(func(r storage.AuditRecord) bool { return slices.Contains(r.PatientIDs, "pat_x") })},
		{"patient within org", storage.AuditQuery{OrgID: "org_b", PatientID: "pat_x"},
			match(func(r storage.AuditRecord) bool { return r.OrgID == "org_b" && slices.Contains(r.PatientIDs, "pat_x") })},
		{"single patient", storage.AuditQuery{PatientID: "pat_11"}, match(func(r storage.AuditRecord) bool { return slices.Contains(r.PatientIDs, "pat_11") })},
		{"patient is exact", storage.AuditQuery{PatientID: "pat_"}, nil},
		{"operation", storage.AuditQuery{Operation: ops[2]}, match(func(r storage.AuditRecord) bool { return r.Operation == ops[2] })},
		{"everything at once", storage.AuditQuery{OrgID: "org_a", From: from, To: to, KeyID: "key_org_a_0", Operation: ops[0]},
			match(func(r storage.AuditRecord) bool {
				return r.OrgID == "org_a" && !r.Time.Before(from) && r.Time.Before(to) && r.KeyID == "key_org_a_0" && r.Operation == ops[0]
			})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name != "key of another org" && tt.name != "patient is exact" && len(tt.want) == 0 {
				t.Fatal("test matches nothing: it could not fail")
			}
			q := tt.q
			q.Limit = 5
			page := mustQueryAudit(t, s, q)
			if page.Total != int64(len(tt.want)) {
				t.Errorf("total %d, want %d", page.Total, len(tt.want))
			}
			if n := min(5, len(tt.want)); !slices.Equal(recordIDs(page.Records), recordIDs(tt.want[:n])) {
				t.Errorf("first page %v, want %v", recordIDs(page.Records), recordIDs(tt.want[:n]))
			}
			if all := queryAllAudit(t, s, q); !slices.Equal(recordIDs(all), recordIDs(tt.want)) {
				t.Errorf("all pages %v, want %v", recordIDs(all), recordIDs(tt.want))
			}
		})
	}
}

func testAuditPaging(t *testing.T, s storage.AuditLog) {
	var rs []storage.AuditRecord
	for i := range 47 {
		rs = append(rs, record("org_a", "key_1", "GET /v1/events", time.Duration(i/5)*time.Second))
	}
	mustAppendAudit(t, s, rs)
	for _, limit := range []int{1, 5, 6, 46, 47, 100} {
		got := queryAllAudit(t, s, storage.AuditQuery{OrgID: "org_a", Limit: limit})
		if want := newestRecordsFirst(rs); !slices.Equal(recordIDs(got), recordIDs(want)) {
			t.Errorf("limit %d: visited %d records, want each of %d once in order", limit, len(got), len(want))
		}
	}
}

func testAuditBadCursor(t *testing.T, s storage.AuditLog) {
	mustAppendAudit(t, s, []storage.AuditRecord{record("org_a", "key_1", "op", 0)})
	for _, cursor := range []string{"%%%", "bm90IGEgY3Vyc29y"} {
		if _, err := s.QueryAudit(ctxFor(t), storage.AuditQuery{Cursor: cursor}); !errors.Is(err, storage.ErrBadCursor) {
			t.Errorf("cursor %q: err = %v, want storage.ErrBadCursor", cursor, err)
		}
	}
}
