package rest_test

import (
	"net/http"
	"testing"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// TestRetention drives /v1/organizations/{id}/retention: the platform operator sets a policy,
// the organization's administrators read it, an audit retention under six years is a 422
// naming the field.
func TestRetention(t *testing.T) {
	s := servertest.Start(t)
	platform, admin := s.PlatformKey(), s.DemoKey()
	other := s.Key("northwind-health", access.Live, access.Scopes...)
	path := "/v1/organizations/" + demo.DemoOrgSlug + "/retention"

	var got struct {
		OrganizationID     string `json:"organizationId"`
		EventRetentionDays *int   `json:"eventRetentionDays"`
		AuditRetentionDays *int   `json:"auditRetentionDays"`
	}
	r := s.Do(http.MethodGet, path, admin, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET: %d %s", r.Status, r.Body)
	}
	r.JSON(t, &got)
	if got.OrganizationID != s.OrgID(demo.DemoOrgSlug) || got.EventRetentionDays != nil || got.AuditRetentionDays != nil {
		t.Fatalf("without a policy both logs are kept forever: %s", r.Body)
	}

	var refused struct {
		Error struct {
			Code    string         `json:"code"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	r = s.Do(http.MethodPut, path, platform, map[string]any{"eventRetentionDays": 30, "auditRetentionDays": 365})
	if r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("an audit retention of a year: %d %s, want 422", r.Status, r.Body)
	}
	r.JSON(t, &refused)
	if fields, _ := refused.Error.Details["fields"].(map[string]any); fields["auditRetentionDays"] == nil {
		t.Fatalf("the 422 does not name auditRetentionDays: %s", r.Body)
	}

	for _, c := range []struct {
		name, key string
		status    int
	}{
		{"an organization's admin may not set its retention", admin, http.StatusForbidden},
		{"another tenant's organization does not exist for it", other, http.StatusNotFound},
		{"the platform operator sets it", platform, http.StatusOK},
	} {
		r = s.Do(http.MethodPut, path, c.key, map[string]any{"eventRetentionDays": 400, "auditRetentionDays": 2192})
		if r.Status != c.status {
			t.Fatalf("%s: %d %s, want %d", c.name, r.Status, r.Body, c.status)
		}
	}
	r = s.Do(http.MethodGet, path, admin, nil)
	r.JSON(t, &got)
	if got.EventRetentionDays == nil || *got.EventRetentionDays != 400 || got.AuditRetentionDays == nil || *got.AuditRetentionDays != 2192 {
		t.Fatalf("the policy read back: %s", r.Body)
	}
	if r = s.Do(http.MethodPut, path, platform, map[string]any{"eventRetentionDays": 30, "keepForever": true}); r.Status != http.StatusBadRequest &&
		r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("an unknown field: %d %s", r.Status, r.Body)
	}
}
