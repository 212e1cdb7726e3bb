package fhir

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"carehub/kernel/fault"
)

// TestRetryAfter checks that the FHIR base's 429 and 503 answers carry Retry-After: the wait of
// observation intake when it refused (as POST /v1/observations answers), else one second for a
// 503; other answers none.
func TestRetryAfter(t *testing.T) {
	behind := fault.Unavailable("the observation writers are behind")
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"intake behind", withRetryAfter(behind, 2500*time.Millisecond), "3"},
		{"intake behind, under a second", withRetryAfter(behind, 200*time.Millisecond), "1"},
		{"another 503", fault.Unavailable("the database is unavailable"), "1"},
		{"rate limited with its own wait", withRetryAfter(fault.New(fault.KindRateLimited, "slow down"), 7*time.Second), "7"},
		{"a 400", withRetryAfter(fault.Invalid("bad"), time.Second), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			writeError(w, httptest.NewRequest(http.MethodPost, Base+"/Observation", nil), tc.err)
			if got := w.Header().Get("Retry-After"); got != tc.want {
				t.Errorf("status %d, Retry-After %q, want %q", w.Code, got, tc.want)
			}
		})
	}
}
