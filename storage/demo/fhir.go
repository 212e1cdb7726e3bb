package demo

import (
	"encoding/json"
	"time"
)

// FHIR R4 JSON shapes, only the elements the demo writes, in the order FHIR lists them.

type coding struct {
	System  string `json:"system"`
	Code    string `json:"code"`
	Display string `json:"display,omitempty"`
}

type codeableConcept struct {
	Coding []coding `json:"coding"`
	Text   string   `json:"text,omitempty"`
}

type reference struct {
	Reference string `json:"reference,omitempty"`
	Display   string `json:"display,omitempty"`
}

type meta struct {
	LastUpdated string   `json:"lastUpdated,omitempty"`
	Tag         []coding `json:"tag,omitempty"`
}

type identifier struct {
	System string `json:"system"`
	Value  string `json:"value"`
}

type humanName struct {
	Use    string   `json:"use"`
	Family string   `json:"family"`
	Given  []string `json:"given"`
}

type contactPoint struct {
	System string `json:"system"`
	Value  string `json:"value"`
	Use    string `json:"use,omitempty"`
}

type address struct {
	Use        string   `json:"use,omitempty"`
	Line       []string `json:"line"`
	City       string   `json:"city"`
	State      string   `json:"state"`
	PostalCode string   `json:"postalCode"`
	Country    string   `json:"country,omitempty"`
}

type period struct {
	Start string `json:"start"`
	End   string `json:"end,omitempty"`
}

type quantity struct {
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"`
	System string  `json:"system"`
	Code   string  `json:"code"`
}

type patientResource struct {
	ResourceType         string         `json:"resourceType"`
	ID                   string         `json:"id"`
	Meta                 meta           `json:"meta"`
	Identifier           []identifier   `json:"identifier"`
	Active               bool           `json:"active"`
	Name                 []humanName    `json:"name"`
	Telecom              []contactPoint `json:"telecom"`
	Gender               string         `json:"gender"`
	BirthDate            string         `json:"birthDate"`
	Address              []address      `json:"address"`
	ManagingOrganization reference      `json:"managingOrganization"`
}

type observationResource struct {
	ResourceType      string          `json:"resourceType"`
	ID                string          `json:"id"`
	Status            string          `json:"status"`
	Category          json.RawMessage `json:"category"`
	Code              json.RawMessage `json:"code"`
	Subject           json.RawMessage `json:"subject"`
	EffectiveDateTime string          `json:"effectiveDateTime"`
	Issued            string          `json:"issued"`
	ValueQuantity     quantity        `json:"valueQuantity"`
	Device            *reference      `json:"device,omitempty"`
}

// syntheticTag marks a synthetic patient's resource, with FHIR's code for test health data.
var syntheticTag = coding{System: "http://terminology.hl7.org/CodeSystem/v3-ActReason", Code: "HTEST", Display: "test health data"}

var vitalSignsCategory = mustJSON([]codeableConcept{{
	Coding: []coding{{System: "http://terminology.hl7.org/CodeSystem/observation-category", Code: "vital-signs", Display: "Vital Signs"}},
	Text:   "Vital Signs",
}})

// codeJSON holds the Observation.code of each vital sign, in vitalCodes order.
var codeJSON = func() (out [len(vitalCodes)]json.RawMessage) {
	for i, c := range vitalCodes {
		out[i] = mustJSON(codeableConcept{
			Coding: []coding{{System: "http://loinc.org", Code: c.loinc, Display: c.display}},
			Text:   c.display,
		})
	}
	return out
}()

// mustJSON marshals the package's own FHIR types, which cannot fail to encode.
func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic("demo: marshal " + err.Error())
	}
	return b
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339) }
