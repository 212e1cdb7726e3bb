package main

import (
	"testing"
	"time"

	"carehub/loadtest/loadcli"
	"carehub/loadtest/loadcli/loadclitest"
)

func TestValidate(t *testing.T) {
	ok := func() config {
		return config{Sample: 10, Poll: 25 * time.Millisecond, Command: loadcli.Command{URL: "http://127.0.0.1:8080", Keys: []string{"chk_live_x"},
			Load: loadcli.Load{Clients: 4, Duration: 10 * time.Second, Drain: 30 * time.Second, Batch: 1}}}
	}
	loadclitest.Validate(t, ok, (*config).validate, []loadclitest.Case[config]{
		{Name: "defaults", Edit: func(*config) {}},
		{Name: "localhost", Edit: func(c *config) { c.URL = "http://localhost:8080" }},
		{Name: "ipv6 loopback", Edit: func(c *config) { c.URL = "http://[::1]:8080" }},
		{Name: "remote host", Edit: func(c *config) { c.URL = "http://10.0.0.5:8080" }, Want: "not a loopback address"},
		{Name: "named remote host", Edit: func(c *config) { c.URL = "https://carehub.example.com" }, Want: "not a loopback address"},
		{Name: "not a URL", Edit: func(c *config) { c.URL = "127.0.0.1:8080" }, Want: "-url"},
		{Name: "no key", Edit: func(c *config) { c.Keys = nil }, Want: "-key"},
		{Name: "sample zero", Edit: func(c *config) { c.Sample = 0 }, Want: "-sample"},
		{Name: "load bounds", Edit: func(c *config) { c.Clients = 0 }, Want: "-c"},
		{Name: "poll too fast", Edit: func(c *config) { c.Poll = time.Millisecond }, Want: "-poll"},
	})
}
