package attacktest

import (
	"net/http"
	"strings"
	"testing"

	"carehub/cmd/carehub/node"
	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// TestOrganizationRateShared: keys are cheap, so a tenant holding twenty had twenty times a
// key's rate of the node, and the soak's attacker paid for its traffic in the other tenants'
// latency. An organization's keys share its rate (--rate-per-org, default 100/s with 2 s of
// burst; 5/s here, so that the test does not depend on how fast the node answers): past it each
// of its keys is refused with 429 and Retry-After, while another organization's key is served.
func TestOrganizationRateShared(t *testing.T) {
	s := servertest.Start(t, func(c *node.Config) { c.RatePerOrg = 5 })
	var keys []string
	for range 6 { // 6 keys × 10 calls: within each key's burst of 100, past the organization's 10
		keys = append(keys, s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients))
	}
	other := s.Key("lakeside-clinic", access.Live, access.ReadPatients)
	refused := 0
	for i := range 60 {
		r := s.Do(http.MethodGet, "/v1/patients?limit=1", keys[i%len(keys)], nil)
		switch {
		case r.Status == http.StatusTooManyRequests:
			refused++
			if !strings.Contains(string(r.Body), "organization") || r.Header.Get("Retry-After") == "" {
				t.Fatalf("refusal %d: %v %s", i, r.Header, r.Body)
			}
		case r.Status != http.StatusOK:
			t.Fatalf("call %d: HTTP %d %s", i, r.Status, r.Body)
		}
	}
	if refused == 0 {
		t.Fatal("60 calls of one organization's six keys in a burst: none refused")
	}
	if r := s.Do(http.MethodGet, "/v1/patients?limit=1", other, nil); r.Status != http.StatusOK {
		t.Fatalf("another organization's key while the first is refused: HTTP %d %s", r.Status, r.Body)
	}
}
