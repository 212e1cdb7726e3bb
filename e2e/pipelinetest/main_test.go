package pipelinetest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"carehub/e2e/pipelinetest"
	"carehub/e2e/servertest"
	"carehub/storage/demo"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// uniqueType is an event type no other test (or earlier run on a shared broker) publishes, so
// GET /v1/events?type= selects exactly this test's events.
func uniqueType(t testing.TB, what string) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "pipelinetest." + what + "_" + hex.EncodeToString(b)
}

// client is a Client of the in-process node s with a fresh demo key of its own (rate limits are
// per key).
func client(s *servertest.Server) *pipelinetest.Client {
	return &pipelinetest.Client{BaseURL: s.URL, Key: s.DemoKey(), HTTP: &http.Client{Timeout: 30 * time.Second}}
}

func sepsisProject(t testing.TB, c *pipelinetest.Client) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := c.ProjectID(ctx, demo.SepsisProjectName)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// payload is what every test publishes: who published it, so an event in the log can be traced
// to the call that made it (or to no call at all, which would be a phantom).
type payload struct {
	Worker int `json:"worker"`
	Seq    int `json:"seq"`
}

func decodePayload(t testing.TB, ev pipelinetest.Event) payload {
	t.Helper()
	var p payload
	if err := json.Unmarshal(ev.Payload, &p); err != nil {
		t.Fatalf("event %s: payload %s: %v", ev.ID, ev.Payload, err)
	}
	return p
}

// logCheck is what the event log holds of one type: every event, once, as published.
type logCheck struct {
	byID       map[string]pipelinetest.Event
	duplicates []string // ids served more than once
	total      int64    // meta.total
	pages      int
}

// readLog pages through every event of typ in project with the cursor, pageSize at a time, and
// checks each is of typ, in project, from publishEvent, and served newest first.
func readLog(t testing.TB, c *pipelinetest.Client, project, typ string, pageSize int) logCheck {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	evs, total, pages, err := c.AllEvents(ctx, pipelinetest.Query{ProjectID: project, Type: typ, Limit: pageSize}, 10_000)
	if err != nil {
		t.Fatalf("read the event log: %v", err)
	}
	lc := logCheck{byID: map[string]pipelinetest.Event{}, total: total, pages: pages}
	for i, ev := range evs {
		if _, dup := lc.byID[ev.ID]; dup {
			lc.duplicates = append(lc.duplicates, ev.ID)
		}
		lc.byID[ev.ID] = ev
		if ev.Type != typ || ev.ProjectID != project || ev.Source != "integration" {
			t.Errorf("event %s: type %q project %q source %q, want %q %q integration", ev.ID, ev.Type, ev.ProjectID, ev.Source, typ, project)
		}
		if i > 0 {
			prev := evs[i-1]
			if prev.CreatedAt.Before(ev.CreatedAt) || (prev.CreatedAt.Equal(ev.CreatedAt) && prev.ID < ev.ID) {
				t.Errorf("not newest first: %s (%v) before %s (%v)", prev.ID, prev.CreatedAt, ev.ID, ev.CreatedAt)
			}
		}
	}
	return lc
}

// visible counts how many of ids the log serves now.
func visible(t testing.TB, c *pipelinetest.Client, project, typ string, ids []string) (found int) {
	t.Helper()
	lc := readLog(t, c, project, typ, 1000)
	for _, id := range ids {
		if _, ok := lc.byID[id]; ok {
			found++
		}
	}
	return found
}
