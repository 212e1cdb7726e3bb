package storage

import (
	"testing"
	"time"

	"carehub/kernel/events"
)

func TestCursor(t *testing.T) {
	at := time.Date(2026, 11, 21, 12, 0, 0, 123456000, time.UTC)
	gotAt, gotID, err := DecodeCursor(EncodeCursor(at, "evt_1"))
	if err != nil || !gotAt.Equal(at) || gotID != "evt_1" {
		t.Fatalf("round trip: %v %q %v", gotAt, gotID, err)
	}
	for _, bad := range []string{"", "!!", "MQ", "Mi4xLmV2dA"} { // "", junk, "1", "2.1.evt"
		if _, _, err := DecodeCursor(bad); err != ErrBadCursor {
			t.Errorf("DecodeCursor(%q) = %v, want ErrBadCursor", bad, err)
		}
	}
}

func TestTrimPage(t *testing.T) {
	at := time.Date(2026, 11, 25, 4, 0, 0, 0, time.UTC)
	evs := []events.Event{{ID: "a", CreatedAt: at}, {ID: "b", CreatedAt: at}, {ID: "c", CreatedAt: at}}
	if got, next := TrimPage(evs, 3, events.Event.CursorKey); len(got) != 3 || next != "" {
		t.Fatalf("last page: %d events, cursor %q", len(got), next)
	}
	got, next := TrimPage(evs, 2, events.Event.CursorKey)
	if len(got) != 2 || next != EncodeCursor(at, "b") {
		t.Fatalf("a page with more: %d events, cursor %q", len(got), next)
	}
}
