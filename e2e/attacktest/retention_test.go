package attacktest

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"carehub/e2e/servertest"
	"carehub/storage/demo"
)

// Finding 9 of issue 51: auditRetentionDays 107000003 passed the six-year floor and put the
// purge's cut-off outside the stores' time range, where it wrapped around into the future: the
// next purge deleted every audit record of the organization. 2^31 answered 500. Every number of
// days over 100 years is now refused with 422 naming the field, and a valid policy still holds.
func TestRetentionDaysHaveACeiling(t *testing.T) {
	s := servertest.Start(t)
	platform := s.PlatformKey()
	path := "/v1/organizations/" + s.OrgID(demo.DemoOrgSlug) + "/retention"
	for _, c := range []struct {
		body  string
		field string
	}{
		{`{"auditRetentionDays": 107000003}`, "auditRetentionDays"},
		{`{"auditRetentionDays": 2147483648}`, "auditRetentionDays"},
		{`{"auditRetentionDays": 36501}`, "auditRetentionDays"},
		{`{"eventRetentionDays": 107000003}`, "eventRetentionDays"},
		{`{"eventRetentionDays": 9223372036854775807}`, "eventRetentionDays"},
		{`{"eventRetentionDays": 36501, "auditRetentionDays": 2192}`, "eventRetentionDays"},
	} {
		r := s.Do(http.MethodPut, path, platform, c.body)
		if r.Status != http.StatusUnprocessableEntity || !strings.Contains(string(r.Body), c.field) {
			t.Errorf("PUT %s: HTTP %d %s; want 422 naming %s", c.body, r.Status, r.Body, c.field)
		}
	}
	var kept struct{ EventRetentionDays, AuditRetentionDays *int }
	s.Do(http.MethodGet, path, s.DemoKey(), nil).JSON(t, &kept)
	if kept.EventRetentionDays != nil || kept.AuditRetentionDays != nil {
		t.Fatalf("a refused policy was stored: %+v", kept)
	}

	// The ceiling itself is a policy.
	r := s.Do(http.MethodPut, path, platform, `{"eventRetentionDays": 36500, "auditRetentionDays": 36500}`)
	var set struct{ EventRetentionDays, AuditRetentionDays int }
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &set) != nil || set.EventRetentionDays != 36500 || set.AuditRetentionDays != 36500 {
		t.Fatalf("PUT 100 years: HTTP %d %s", r.Status, r.Body)
	}
}
