package marketplace

import (
	"strings"
	"testing"
)

func TestAutomatedScore(t *testing.T) {
	long := strings.Repeat("x", 200)
	for _, tc := range []struct {
		name string
		in   Submission
		want Score
	}{
		{"bare model", Submission{Type: "MODEL", Version: "beta"},
			Score{Security: 40, Privacy: 100, ClinicalSafety: 40, Overall: 60}},
		{"documented model over observations", Submission{Type: "MODEL", Version: "1.2.3", Description: long, SupportEmail: "a@b.org",
			DocumentationURL: "https://docs.example.org", FHIRResources: []string{"Patient", "Observation"}},
			Score{Security: 100, Privacy: 80, ClinicalSafety: 100, Overall: 93}},
		{"http documentation earns clinical but not security points", Submission{Type: "CONNECTOR", Version: "v2.0.0",
			DocumentationURL: "http://docs.example.org", SupportEmail: "a@b.org"},
			Score{Security: 80, Privacy: 100, ClinicalSafety: 85, Overall: 88}},
		{"privacy floor", Submission{Type: "DATASET", Version: "1", FHIRResources: []string{"Patient", "Observation",
			"DiagnosticReport", "Encounter", "Condition", "MedicationRequest", "CarePlan", "Device"}},
			Score{Security: 40, Privacy: 60, ClinicalSafety: 70, Overall: 57}},
	} {
		if got := AutomatedScore(tc.in); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestSubmissionValidate(t *testing.T) {
	fee := -1.0
	in := Submission{Name: " ", Description: "d", Version: "1.0.0", Type: "ROBOT", Category: "c", PricingType: "FREE",
		MonthlyFee: &fee, DocumentationURL: "ftp://x", SupportEmail: "nobody", FHIRResources: []string{"Patient", "Spaceship"}}
	bad := in.validate()
	for _, f := range []string{"name", "type", "monthlyFee", "documentationUrl", "supportEmail", "fhirResources"} {
		if bad[f] == "" {
			t.Errorf("no complaint about %s: %v", f, bad)
		}
	}
	good := Submission{Name: "n", Description: "d", Version: "1.0.0", Type: "APP", Category: "c", PricingType: "FREE", SupportEmail: "a@b.org"}
	if bad := good.validate(); len(bad) > 0 {
		t.Errorf("valid submission refused: %v", bad)
	}
}
