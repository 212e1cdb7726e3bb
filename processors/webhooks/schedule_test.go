package webhooks

import (
	"net/http"
	"testing"
	"time"
)

func TestRetryDelayFollowsTheScheduleWithinJitter(t *testing.T) {
	for next := 1; next < len(DefaultSchedule); next++ {
		base := DefaultSchedule[next]
		for range 200 {
			d, ok := retryDelay(DefaultSchedule, next, 0)
			if !ok || d < time.Duration(float64(base)*0.9) || d > time.Duration(float64(base)*1.1) {
				t.Fatalf("attempt %d: delay %s (ok %v), want %s ±10%%", next, d, ok, base)
			}
		}
	}
	if _, ok := retryDelay(DefaultSchedule, len(DefaultSchedule), 0); ok {
		t.Error("a delay after the last attempt")
	}
	if d, _ := retryDelay(DefaultSchedule, 1, time.Hour); d != time.Hour {
		t.Errorf("Retry-After of an hour gave %s", d)
	}
	if d, _ := retryDelay(DefaultSchedule, 1, 48*time.Hour); d != maxRetryAfter {
		t.Errorf("Retry-After is not capped: %s", d)
	}
	if len(DefaultSchedule) != 8 || DefaultSchedule[0] != 0 || DefaultSchedule[7] != 10*time.Hour {
		t.Errorf("DefaultSchedule %v is not DECISIONS §5's", DefaultSchedule)
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"120", 2 * time.Minute},
		{"0", 0},
		{"-5", 0},
		{"soon", 0},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
		{"999999999", maxRetryAfter},
	} {
		if got := parseRetryAfter(tc.in, now); got != tc.want {
			t.Errorf("parseRetryAfter(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
