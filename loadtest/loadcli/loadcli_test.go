package loadcli

import (
	"strings"
	"testing"
	"time"
)

func TestLoadValidate(t *testing.T) {
	ok := Load{Clients: 4, Duration: 10 * time.Second, Drain: 30 * time.Second, Batch: 1}
	cases := []struct {
		name string
		edit func(*Load)
		want string // "" for valid
	}{
		{"defaults", func(*Load) {}, ""},
		{"too many clients", func(l *Load) { l.Clients = MaxClients + 1 }, "-c"},
		{"no clients", func(l *Load) { l.Clients = 0 }, "-c"},
		{"unbounded duration", func(l *Load) { l.Duration = MaxDuration + time.Second }, "-d"},
		{"zero duration", func(l *Load) { l.Duration = 0 }, "-d"},
		{"drain too long", func(l *Load) { l.Drain = MaxDrain + time.Second }, "-drain"},
		{"negative rate", func(l *Load) { l.Rate = -1 }, "-rate"},
		{"payload too large", func(l *Load) { l.Payload = MaxPayload + 1 }, "-payload"},
		{"batch of 1,000", func(l *Load) { l.Batch = MaxBatch }, ""},
		{"batch too large", func(l *Load) { l.Batch = MaxBatch + 1 }, "-batch"},
		{"batch zero", func(l *Load) { l.Batch = 0 }, "-batch"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := ok
			tc.edit(&l)
			err := l.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("want valid, got %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("want an error naming %q, got %v", tc.want, err)
			}
		})
	}
}

func TestLoopback(t *testing.T) {
	for raw, ok := range map[string]bool{
		"http://127.0.0.1:8080": true, "http://localhost:8080": true, "https://[::1]:8443": true,
		"http://10.0.0.5:8080": false, "https://carehub.example.com": false, "127.0.0.1:8080": false,
	} {
		if err := LoopbackURL(raw); (err == nil) != ok {
			t.Errorf("LoopbackURL(%q) = %v, want ok=%v", raw, err, ok)
		}
	}
}
