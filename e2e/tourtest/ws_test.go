package tourtest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"carehub/api/ws/wstest"
	"carehub/e2e/servertest"
)

// The README's WebSocket section on a live node: the key in connection_init with or without
// "Bearer ", and a refused one closed with 4403 and a reason that says what was wrong.
func TestREADMEWebSocketKeys(t *testing.T) {
	s := servertest.Start(t)
	wsURL := "ws" + strings.TrimPrefix(s.URL, "http") + "/graphql"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, auth := range []string{"Bearer " + s.DemoKey(), s.DemoKey()} {
		c, err := wstest.Dial(ctx, wsURL, auth)
		if err != nil {
			t.Fatalf("connection_init with %q…: %v", auth[:7], err)
		}
		c.Close()
	}
	for _, tt := range []struct{ auth, reason string }{
		{"Bearer chk_test_00000000000000000000000000000000", "Forbidden: invalid API key or token"},
		{"chk_test_00000000000000000000000000000000", "Forbidden: invalid API key or token"},
		{"", `Forbidden: connection_init payload has no "Authorization"`},
	} {
		_, err := wstest.Dial(ctx, wsURL, tt.auth)
		var ce websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != 4403 || ce.Reason != tt.reason {
			t.Errorf("connection_init with %q: %v, want close 4403 %q", tt.auth, err, tt.reason)
		}
	}
}
