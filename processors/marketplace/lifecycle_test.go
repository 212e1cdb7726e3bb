package marketplace_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func gql(t *testing.T, s *servertest.Server, key, query string, vars map[string]any, v any) []servertest.GraphQLError {
	t.Helper()
	res := s.GraphQL(key, query, vars)
	if v != nil && len(res.Errors) == 0 {
		if err := json.Unmarshal(res.Data, v); err != nil {
			t.Fatalf("decode %s: %v", res.Data, err)
		}
	}
	return res.Errors
}

// event returns the org and payload of the one outbox event of typ about asset id.
func event(t *testing.T, s *servertest.Server, typ, id string) (string, map[string]any) {
	t.Helper()
	var org string
	var p map[string]any
	if err := s.Pool().QueryRow(context.Background(), `select value->>'orgId', value->'payload' from outbox
where value->>'type' = $1 and value->'payload'->>'assetId' = $2`, typ, id).Scan(&org, &p); err != nil {
		t.Fatalf("%s of %s: %v", typ, id, err)
	}
	return org, p
}

// TestReviewLifecycle: submitAsset → UNDER_REVIEW with the rubric's score; the platform reviewer
// rejects one submission and approves another; only the approved one installs; its publisher
// (with publish:assets) deprecates it. Each change is announced with its event.
func TestReviewLifecycle(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	platform := s.PlatformKey()
	adminOnly := s.Key(demo.DemoOrgSlug, access.Live, access.AdminOrg)
	submit := `mutation($in: SubmitAssetInput!) { submitAsset(input: $in) { id status message } }`
	review := `mutation($a: ID!, $d: String!, $n: String) { reviewAsset(assetId: $a, decision: $d, notes: $n) { status } }`
	deprecate := `mutation($a: ID!) { deprecateAsset(assetId: $a) { status } }`
	install := `mutation($a: ID!, $p: ID!) { installAsset(assetId: $a, projectId: $p) { id } }`
	project := s.ProjectID(demo.SepsisProjectName)
	ids := map[string]string{}
	for _, name := range []string{"Rejected Bot", "Approved Bot"} {
		var d struct {
			SubmitAsset struct{ ID, Status, Message string }
		}
		// An undocumented AGENT over observations: security 40+20 (email)+20 (semver) = 80,
		// privacy 90-5 = 85, clinical 40+20 (Observation) = 60: overall round(225/3) = 75.
		in := map[string]any{"name": name, "description": "Watches vitals.", "version": "0.1.0", "type": "AGENT", "category": "Triage",
			"fhirResources": []string{"Observation"}, "pricingType": "FREE", "supportEmail": "bots@example.org"}
		if errs := gql(t, s, key, submit, map[string]any{"in": in}, &d); len(errs) > 0 {
			t.Fatal(errs)
		}
		if d.SubmitAsset.Status != "UNDER_REVIEW" || !strings.Contains(d.SubmitAsset.Message, "score 75/100 (security 80, privacy 85, clinical safety 60)") {
			t.Fatalf("submission %+v", d.SubmitAsset)
		}
		ids[name] = d.SubmitAsset.ID
		if org, p := event(t, s, "asset.submitted", d.SubmitAsset.ID); org != demo.DemoOrgID || p["status"] != "UNDER_REVIEW" || p["name"] != name {
			t.Fatalf("asset.submitted %s %v", org, p)
		}
	}
	rejected, approved := ids["Rejected Bot"], ids["Approved Bot"]

	var d struct{ ReviewAsset struct{ Status string } }
	if errs := gql(t, s, platform, review, map[string]any{"a": rejected, "d": "REJECTED", "n": "no clinical validation"}, &d); len(errs) > 0 || d.ReviewAsset.Status != "REJECTED" {
		t.Fatalf("reject: %v %+v", errs, d)
	}
	if _, p := event(t, s, "asset.rejected", rejected); p["status"] != "REJECTED" || p["reason"] != "no clinical validation" {
		t.Fatalf("asset.rejected %v", p)
	}
	if errs := gql(t, s, platform, review, map[string]any{"a": approved, "d": "APPROVED"}, &d); len(errs) > 0 || d.ReviewAsset.Status != "APPROVED" {
		t.Fatalf("approve: %v %+v", errs, d)
	}
	if _, p := event(t, s, "asset.approved", approved); p["status"] != "APPROVED" {
		t.Fatalf("asset.approved %v", p)
	}

	for _, tc := range []struct {
		name, key, query string
		vars             map[string]any
		code             string
	}{
		{"install a rejected asset", key, install, map[string]any{"a": rejected, "p": project}, "CONFLICT"},
		{"deprecate a rejected asset", key, deprecate, map[string]any{"a": rejected}, "CONFLICT"},
		{"deprecate without publish:assets", adminOnly, deprecate, map[string]any{"a": approved}, "FORBIDDEN"},
		{"review twice", platform, review, map[string]any{"a": approved, "d": "REJECTED"}, "CONFLICT"},
	} {
		errs := gql(t, s, tc.key, tc.query, tc.vars, nil)
		if len(errs) == 0 || errs[0].Code() != tc.code {
			t.Errorf("%s: %+v, want %s", tc.name, errs, tc.code)
		}
	}
	if errs := gql(t, s, key, install, map[string]any{"a": approved, "p": project}, nil); len(errs) > 0 {
		t.Fatalf("install the approved asset: %v", errs)
	}
	var dep struct{ DeprecateAsset struct{ Status string } }
	if errs := gql(t, s, key, deprecate, map[string]any{"a": approved}, &dep); len(errs) > 0 || dep.DeprecateAsset.Status != "DEPRECATED" {
		t.Fatalf("deprecate: %v %+v", errs, dep)
	}
	if _, p := event(t, s, "asset.deprecated", approved); p["status"] != "DEPRECATED" {
		t.Fatalf("asset.deprecated %v", p)
	}
	if errs := gql(t, s, key, install, map[string]any{"a": approved, "p": project}, nil); len(errs) == 0 || errs[0].Code() != "CONFLICT" {
		t.Fatalf("install a deprecated asset: %v", errs)
	}
}
