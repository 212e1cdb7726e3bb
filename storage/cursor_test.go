package storage

import (
	"testing"
	"time"
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
