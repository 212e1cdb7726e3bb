package fhirsubs

import (
	"encoding/json"
	"slices"
	"strings"

	"carehub/kernel/clinical"
	"carehub/kernel/events"
)

// TopicBase starts the canonical URL of every topic of carehub's catalogue.
const TopicBase = "https://carehub.example/fhir/SubscriptionTopic/"

// Topic is one SubscriptionTopic of the catalogue: what it notifies of, the resource each
// notification is about (its focus) and the filters a subscription may set on it.
type Topic struct {
	ID          string
	Title       string
	Description string
	Resource    string   // the focus's resource type
	Filters     []Filter // the filter parameters a subscription may use
	// match reports whether an event (already of the topic's source type) is one of the topic's,
	// with rising telling whether the patient's previous assessment of the same code was lower
	// (only the risk topics ask).
	source string
	match  func(p payload, rising func() (bool, error)) (bool, error)
}

// Filter is a filter parameter of a topic.
type Filter struct {
	Name        string
	Type        string // the R5 SubscriptionTopic.canFilterBy's search parameter type
	Description string
}

// URL is the topic's canonical URL: what a Subscription's criteria names.
func (t Topic) URL() string { return TopicBase + t.ID }

// payload is what the topics read of an event's payload.
type payload struct {
	ObservationID string   `json:"observationId"`
	ReportID      string   `json:"reportId"`
	PatientID     string   `json:"patientId"`
	Code          string   `json:"code"`
	Value         *float64 `json:"value"`
	Severity      string   `json:"severity"`
}

// focus returns the resource an event of p is about.
func (p payload) focus() (typ, id string) {
	if p.ReportID != "" {
		return "RiskAssessment", p.ReportID
	}
	return "Observation", p.ObservationID
}

var (
	patientFilter = Filter{Name: "patient", Type: "reference", Description: "the patient the resource is about: Patient/{id}"}
	obsCodeFilter = Filter{Name: "code", Type: "token", Description: "the observation's LOINC code, e.g. 8867-4 or http://loinc.org|8867-4"}
	riskFilter    = Filter{Name: "code", Type: "token", Description: "the assessment: news2 or qsofa"}
)

// Topics is carehub's SubscriptionTopic catalogue. Treat it as read-only.
var Topics = []Topic{
	{
		ID: "observation-created", Title: "Observation created",
		Description: "An Observation of a patient was stored: a device reading through /v1/observations, or one posted to the FHIR base.",
		Resource:    "Observation", Filters: []Filter{patientFilter, obsCodeFilter},
		source: events.TypeDeviceObservationReceived,
		match:  func(payload, func() (bool, error)) (bool, error) { return true, nil },
	},
	{
		ID: "vital-out-of-range", Title: "Vital sign out of range",
		Description: "An Observation of a vital sign the NEWS2 chart scores was stored with a value outside the chart's normal band " +
			"(respiratory rate, SpO2 on scale 1, systolic pressure, heart rate, temperature; a parameter score of 1 or more).",
		Resource: "Observation", Filters: []Filter{patientFilter, obsCodeFilter},
		source: events.TypeDeviceObservationReceived,
		match: func(p payload, _ func() (bool, error)) (bool, error) {
			if p.Value == nil {
				return false, nil
			}
			score, ok := clinical.NEWS2ParameterScore(p.Code, *p.Value)
			return ok && score > 0, nil
		},
	},
	{
		ID: "risk-assessment-created", Title: "Risk assessment created",
		Description: "A RiskAssessment (NEWS2 or qSOFA) of a patient was recorded by an agent or a workflow.",
		Resource:    "RiskAssessment", Filters: []Filter{patientFilter, riskFilter},
		source: events.TypeDiagnosticResultReady,
		match:  func(payload, func() (bool, error)) (bool, error) { return true, nil },
	},
	{
		ID: "risk-rising", Title: "Risk rising",
		Description: "A RiskAssessment of a patient was recorded with a higher severity than the patient's previous one of the same " +
			"assessment (NEWS2 or qSOFA); a patient's first assessment rises when it is above NONE.",
		Resource: "RiskAssessment", Filters: []Filter{patientFilter, riskFilter},
		source: events.TypeDiagnosticResultReady,
		match:  func(_ payload, rising func() (bool, error)) (bool, error) { return rising() },
	},
}

// LookupTopic finds a topic by its canonical URL or its id.
func LookupTopic(ref string) (Topic, bool) {
	id := strings.TrimPrefix(ref, TopicBase)
	for _, t := range Topics {
		if t.ID == id {
			return t, true
		}
	}
	return Topic{}, false
}

// sourceTypes are the event types some topic reads.
func sourceTypes() []string {
	var out []string
	for _, t := range Topics {
		if !slices.Contains(out, t.source) {
			out = append(out, t.source)
		}
	}
	return out
}

// Resource4B returns t as an R4B/R5 SubscriptionTopic resource: what GET /fhir/R4/SubscriptionTopic
// serves for clients that read topics (R4 has no such resource; R4 clients find the canonical
// URLs in the CapabilityStatement).
func (t Topic) Resource4B() json.RawMessage {
	type canFilterBy struct {
		Resource        string `json:"resource"`
		FilterParameter string `json:"filterParameter"`
		Description     string `json:"description"`
	}
	type trigger struct {
		Resource    string   `json:"resource"`
		Interaction []string `json:"supportedInteraction"`
		Description string   `json:"description"`
	}
	var filters []canFilterBy
	for _, f := range t.Filters {
		filters = append(filters, canFilterBy{Resource: t.Resource, FilterParameter: f.Name, Description: f.Description})
	}
	b, _ := json.Marshal(map[string]any{
		"resourceType": "SubscriptionTopic", "id": t.ID, "url": t.URL(), "title": t.Title, "status": "active",
		"description":     t.Description,
		"resourceTrigger": []trigger{{Resource: t.Resource, Interaction: []string{"create"}, Description: t.Description}},
		"canFilterBy":     filters,
		"notificationShape": []map[string]any{{"resource": t.Resource,
			"include": []string{t.Resource + ":patient"}}},
	})
	return b
}
