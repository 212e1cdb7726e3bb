package main

import (
	"strings"
	"testing"
	"time"

	"carehub/loadtest/loadcli"
)

func TestValidate(t *testing.T) {
	ok := func() config {
		return config{URL: "http://127.0.0.1:8080", Keys: []string{"chk_live_x"}, Sample: 10, Poll: 25 * time.Millisecond,
			Load: loadcli.Load{Clients: 4, Duration: 10 * time.Second, Drain: 30 * time.Second, Batch: 1}}
	}
	cases := []struct {
		name string
		edit func(*config)
		want string // "" for valid
	}{
		{"defaults", func(*config) {}, ""},
		{"localhost", func(c *config) { c.URL = "http://localhost:8080" }, ""},
		{"ipv6 loopback", func(c *config) { c.URL = "http://[::1]:8080" }, ""},
		{"remote host", func(c *config) { c.URL = "http://10.0.0.5:8080" }, "not a loopback address"},
		{"named remote host", func(c *config) { c.URL = "https://carehub.example.com" }, "not a loopback address"},
		{"not a URL", func(c *config) { c.URL = "127.0.0.1:8080" }, "-url"},
		{"no key", func(c *config) { c.Keys = nil }, "-key"},
		{"sample zero", func(c *config) { c.Sample = 0 }, "-sample"},
		{"load bounds", func(c *config) { c.Clients = 0 }, "-c"},
		{"poll too fast", func(c *config) { c.Poll = time.Millisecond }, "-poll"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := ok()
			tc.edit(&c)
			err := c.validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("want valid, got %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("want an error naming %q, got %v", tc.want, err)
			}
		})
	}
}
