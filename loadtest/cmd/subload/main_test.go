package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"carehub/kernel/whsig"
)

// notificationBody is a notification Bundle as the node sends it (id-only), for events numbered
// nums naming observations obs.
func notificationBody(t *testing.T, typ string, nums []int, obs []string) []byte {
	t.Helper()
	ps := []any{map[string]any{"name": "type", "valueCode": typ}}
	for i, n := range nums {
		ps = append(ps, map[string]any{"name": "notification-event", "part": []any{
			map[string]any{"name": "event-number", "valueString": strconv.Itoa(n)},
			map[string]any{"name": "timestamp", "valueInstant": time.Now().UTC().Format(time.RFC3339Nano)},
			map[string]any{"name": "focus", "valueReference": map[string]any{"reference": "http://x/fhir/R4/Observation/" + obs[i]}},
		}})
	}
	b, err := json.Marshal(map[string]any{"resourceType": "Bundle", "type": "history",
		"entry": []any{map[string]any{"resource": map[string]any{"resourceType": "Parameters", "parameter": ps}}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTracker: signed notifications are matched to the observations by focus, in either order
// with the 202; a repeated event number, one out of order and a bad signature are counted.
func TestTracker(t *testing.T) {
	secret := whsig.NewSecret()
	var seen int
	tr := newTracker(2, func(n int, _ time.Duration) { seen += n })
	tr.setSecret(0, secret)
	tr.setSecret(1, secret)
	post := func(sub string, body []byte, sign bool) int {
		req := httptest.NewRequest(http.MethodPost, "/s/"+sub, bytes.NewReader(body))
		s := secret
		if !sign {
			s = whsig.NewSecret()
		}
		if err := whsig.SetHeaders(req.Header, "msg_1", time.Now(), body, s); err != nil {
			t.Fatal(err)
		}
		w := httptest.NewRecorder()
		tr.ServeHTTP(w, req)
		return w.Code
	}
	tr.accepted(phaseA, time.Now(), []string{"obs_a", "obs_b"}, []int32{0, 0})
	if c := post("0", notificationBody(t, "handshake", nil, nil), true); c != http.StatusOK {
		t.Fatalf("handshake: %d", c)
	}
	post("0", notificationBody(t, "event-notification", []int{2}, []string{"obs-b"}), true)
	post("0", notificationBody(t, "event-notification", []int{1, 2}, []string{"obs-a", "obs-b"}), true)
	// Notified before its 202 was read.
	post("1", notificationBody(t, "event-notification", []int{1}, []string{"obs-c"}), true)
	tr.accepted(phaseA, time.Now(), []string{"obs_c"}, []int32{1})
	if c := post("1", notificationBody(t, "event-notification", []int{2}, []string{"obs-d"}), false); c != http.StatusUnauthorized {
		t.Errorf("a bad signature: %d", c)
	}

	got := tr.phase(phaseA)
	if got.Sent != 3 || got.Notified != 3 || got.Missing != 0 || got.WrongSub != 0 || seen != 3 || tr.lag() != 0 {
		t.Errorf("phase: %+v, observed %d, lag %d", got, seen, tr.lag())
	}
	st := tr.subsTally()
	if st.Handshakes != 1 || st.NoHandshake != 1 || st.DupNumbers != 1 || st.DupFocus != 1 || st.OutOfOrder != 1 ||
		st.Gaps != 0 || st.BadSignature != 1 || st.UnknownObs != 0 {
		t.Errorf("subscriptions: %+v", st)
	}
}
