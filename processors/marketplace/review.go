package marketplace

import (
	"fmt"
	"math"
	"net/mail"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// FHIRResourceTypes are the FHIR resource names an asset may declare (the spec's FHIRResourceType).
var FHIRResourceTypes = []string{"Patient", "Observation", "DiagnosticReport", "Encounter", "Condition",
	"MedicationRequest", "CarePlan", "Device", "Practitioner"}

// phiResources are the FHIR resources that carry protected health information about a patient.
var phiResources = []string{"Patient", "Observation", "DiagnosticReport", "Encounter", "Condition",
	"MedicationRequest", "CarePlan"}

// Score is an asset's compliance score, each part 0..100.
type Score struct {
	Overall, Security, Privacy, ClinicalSafety int
	HIPAACompliant, FDACleared                 bool
}

var semver = regexp.MustCompile(`^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)

// AutomatedScore is the automated review run on every submission. It can only see what the
// submission declares, so it scores the evidence a reviewer would ask for first, and leaves
// HIPAA compliance and FDA clearance false: both need documents (a BAA, a 510(k) number) that a
// platform reviewer checks before approving.
//
// The rubric, each part capped at 100:
//
//	security        40, +20 documentation at an https URL, +20 a support email,
//	                +20 a semantic version (MAJOR.MINOR.PATCH: patch releases are traceable)
//	privacy         100 when no PHI-bearing FHIR resource is declared; otherwise 90 minus 5 for
//	                each PHI-bearing resource (Patient, Observation, DiagnosticReport, Encounter,
//	                Condition, MedicationRequest, CarePlan), at least 60
//	clinical safety MODEL and AGENT assets (clinical decision support) start at 40, others at 70;
//	                +20 (others +15) documentation, +20 (others +15) a description of at least
//	                200 characters (intended use, population, limits), +20 for MODEL and AGENT
//	                assets that declare Observation or DiagnosticReport (their inputs are
//	                inspectable clinical data)
//	overall         the rounded mean of the three
func AutomatedScore(in Submission) Score {
	security := 40
	if in.DocumentationURL != "" && strings.HasPrefix(in.DocumentationURL, "https://") {
		security += 20
	}
	if in.SupportEmail != "" {
		security += 20
	}
	if semver.MatchString(in.Version) {
		security += 20
	}

	privacy := 100
	phi := 0
	for _, r := range in.FHIRResources {
		if slices.Contains(phiResources, r) {
			phi++
		}
	}
	if phi > 0 {
		privacy = max(60, 90-5*phi)
	}

	decisionSupport := in.Type == "MODEL" || in.Type == "AGENT"
	clinical, step := 70, 15
	if decisionSupport {
		clinical, step = 40, 20
	}
	if in.DocumentationURL != "" {
		clinical += step
	}
	if len([]rune(in.Description)) >= 200 {
		clinical += step
	}
	if decisionSupport && (slices.Contains(in.FHIRResources, "Observation") || slices.Contains(in.FHIRResources, "DiagnosticReport")) {
		clinical += 20
	}

	security, privacy, clinical = min(security, 100), min(privacy, 100), min(clinical, 100)
	overall := int(math.Round(float64(security+privacy+clinical) / 3))
	return Score{Overall: overall, Security: security, Privacy: privacy, ClinicalSafety: clinical}
}

// Submission is an asset submitted to the marketplace (SubmitAssetInput).
type Submission struct {
	Name, Description, Version, Type, Category string
	FHIRResources                              []string
	PricingType                                string
	MonthlyFee                                 *float64
	DocumentationURL                           string
	SupportEmail                               string
}

// validate checks a submission and reports every problem at once.
func (in *Submission) validate() map[string]string {
	bad := map[string]string{}
	in.Name = strings.TrimSpace(in.Name)
	in.Version = strings.TrimSpace(in.Version)
	in.Category = strings.TrimSpace(in.Category)
	in.SupportEmail = strings.TrimSpace(in.SupportEmail)
	in.DocumentationURL = strings.TrimSpace(in.DocumentationURL)
	if in.Name == "" || len(in.Name) > 200 {
		bad["name"] = "must be 1 to 200 characters"
	}
	if strings.TrimSpace(in.Description) == "" || len(in.Description) > 10000 {
		bad["description"] = "must be 1 to 10000 characters"
	}
	if in.Version == "" || len(in.Version) > 64 {
		bad["version"] = "must be 1 to 64 characters"
	}
	if !slices.Contains(AssetTypes, in.Type) {
		bad["type"] = "must be one of " + strings.Join(AssetTypes, ", ")
	}
	if in.Category == "" || len(in.Category) > 100 {
		bad["category"] = "must be 1 to 100 characters"
	}
	if !slices.Contains(PricingTypes, in.PricingType) {
		bad["pricingType"] = "must be one of " + strings.Join(PricingTypes, ", ")
	}
	for _, r := range in.FHIRResources {
		if !slices.Contains(FHIRResourceTypes, r) {
			bad["fhirResources"] = fmt.Sprintf("%q is not a FHIR resource type; valid: %s", r, strings.Join(FHIRResourceTypes, ", "))
			break
		}
	}
	if in.MonthlyFee != nil && (*in.MonthlyFee < 0 || math.IsNaN(*in.MonthlyFee) || math.IsInf(*in.MonthlyFee, 0)) {
		bad["monthlyFee"] = "must not be negative"
	}
	if in.PricingType == "FREE" && in.MonthlyFee != nil && *in.MonthlyFee > 0 {
		bad["monthlyFee"] = "a FREE asset has no monthly fee"
	}
	if in.DocumentationURL != "" {
		u, err := url.Parse(in.DocumentationURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			bad["documentationUrl"] = "must be an http(s) URL"
		}
	}
	if a, err := mail.ParseAddress(in.SupportEmail); err != nil || a.Address != in.SupportEmail {
		bad["supportEmail"] = "must be an email address"
	}
	return bad
}
