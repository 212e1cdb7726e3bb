package fhir

import (
	"net/http"
	"time"

	"carehub/processors/fhirsubs"
)

// started is when this process began serving: the CapabilityStatement's date.
var started = time.Now().UTC().Format(time.RFC3339)

// metadata serves the CapabilityStatement: what this node really does, from the same tables the
// handlers use.
func (h handler) metadata(w http.ResponseWriter, r *http.Request) {
	if _, ok := route(w, r); !ok {
		return
	}
	type param struct {
		Name string `json:"name"`
		Type string `json:"type"`
	}
	type interaction struct {
		Code string `json:"code"`
	}
	type operation struct {
		Name       string `json:"name"`
		Definition string `json:"definition"`
	}
	type resource struct {
		Type              string        `json:"type"`
		Interaction       []interaction `json:"interaction"`
		Versioning        string        `json:"versioning"`
		ReadHistory       bool          `json:"readHistory"`
		UpdateCreate      bool          `json:"updateCreate"`
		ConditionalCreate bool          `json:"conditionalCreate"`
		ConditionalRead   string        `json:"conditionalRead,omitempty"`
		ConditionalDelete string        `json:"conditionalDelete,omitempty"`
		SearchInclude     []string      `json:"searchInclude,omitempty"`
		SearchRevInclude  []string      `json:"searchRevInclude,omitempty"`
		SearchParam       []param       `json:"searchParam"`
		Operation         []operation   `json:"operation,omitempty"`
		Documentation     string        `json:"documentation,omitempty"`
		SupportedProfile  []string      `json:"supportedProfile,omitempty"`
		Extension         []any         `json:"extension,omitempty"`
	}
	// subscriptionCapability is Subscription as the topic-based backport serves it (subscriptions.go).
	subscriptionCapability := func() resource {
		const backport = "http://hl7.org/fhir/uv/subscriptions-backport/"
		res := resource{Type: "Subscription", Versioning: "no-version",
			Interaction:      []interaction{{"create"}, {"read"}, {"search-type"}, {"delete"}},
			SearchParam:      []param{{Name: "status", Type: "token"}},
			SupportedProfile: []string{backport + "StructureDefinition/backport-subscription"},
			Operation: []operation{{"status", backport + "OperationDefinition/backport-subscription-status"},
				{"events", backport + "OperationDefinition/backport-subscription-events"},
				{"get-ws-binding-token", backport + "OperationDefinition/backport-subscription-get-ws-binding-token"}},
			Documentation: "Topic-based subscriptions (the Subscriptions R5 Backport IG): criteria is a topic's canonical URL " +
				"(GET SubscriptionTopic lists them, with their filters), filters in the backport-filter-criteria extension; " +
				"channels rest-hook (signed as carehub's webhooks: webhook-id, webhook-timestamp, webhook-signature under the whsec_ " +
				"secret the create answers once) and websocket ($get-ws-binding-token, then bind-with-token on " + Base + WebSocketPath +
				"); payloads empty, id-only and full-resource. Needs read:patients and read:observations. A subscription is changed by " +
				"deleting it and creating another."}
		for _, topic := range fhirsubs.Topics {
			res.Extension = append(res.Extension, map[string]string{
				"url": backport + "StructureDefinition/capabilitystatement-subscriptiontopic-canonical", "valueCanonical": topic.URL()})
		}
		return res
	}
	var resources []resource
	for _, t := range servedTypes() {
		if t == "Subscription" && h.Subscriptions != nil {
			resources = append(resources, subscriptionCapability())
			continue
		}
		res := resource{Type: t, Versioning: "versioned", ReadHistory: true, ConditionalRead: "full-support",
			Interaction: []interaction{{"read"}, {"vread"}, {"history-instance"}, {"history-type"}, {"search-type"}}}
		switch t {
		case "Patient":
			res.Interaction = append(res.Interaction, interaction{"create"}, interaction{"update"}, interaction{"delete"})
			res.ConditionalCreate = true
			res.Versioning, res.ConditionalDelete = "versioned-update", "not-supported"
			res.Operation = []operation{{"export", "http://hl7.org/fhir/uv/bulkdata/OperationDefinition/patient-export"},
				{"everything", "http://hl7.org/fhir/OperationDefinition/Patient-everything"}}
			res.Documentation = "Create assigns a new id whatever id the body carries; update changes an existing patient. " +
				"Conditional create: If-None-Exist, or the POST's query string (fhirpy's get_or_create), with any search of Patient; identifier=system|value is atomic. Update and delete honour If-Match (412 on a stale version). " +
				"Delete keeps the patient's history (reads then 410) and is refused (409) while any resource refers to the patient. " +
				"Risk level and care programs are extensions."
		case "Observation":
			if h.Intake != nil {
				res.Interaction = append(res.Interaction, interaction{"create"})
				res.Documentation = "Create goes through observation intake (as POST /v1/observations): 201 once the broker has it; it is readable moments later. " +
					"Every create is a new Observation with an id carehub assigns, whatever id the body carries; send an Idempotency-Key header to make a retry idempotent. " +
					"Observations are never changed: version 1 is their only version."
			} else {
				res.Documentation = "This node does not run observation intake: create is served by nodes with the ingest role."
			}
		case "RiskAssessment":
			res.Documentation = "Read-only: the NEWS2 and qSOFA reports carehub writes. Needs read:patients and read:observations."
		default: // Encounter and every other type: the generic store (resources.go)
			res.Interaction = append(res.Interaction, interaction{"create"}, interaction{"update"}, interaction{"delete"})
			res.ConditionalCreate, res.UpdateCreate, res.Versioning = true, true, "versioned-update"
			res.Documentation = genericDocumentation(t)
			if t == "Group" {
				res.Operation = []operation{{"export", "http://hl7.org/fhir/uv/bulkdata/OperationDefinition/group-export"}}
			}
		}
		res.SearchInclude = searchIncludes(t)
		res.SearchRevInclude = searchRevIncludes(t)
		for _, p := range paramsOf(t) {
			res.SearchParam = append(res.SearchParam, param{Name: p[0], Type: p[1]})
		}
		resources = append(resources, res)
	}
	cs := map[string]any{
		"resourceType":   "CapabilityStatement",
		"status":         "active",
		"date":           started,
		"publisher":      "carehub",
		"kind":           "instance",
		"software":       map[string]string{"name": "carehub"},
		"implementation": map[string]string{"description": "carehub FHIR R4 base", "url": baseURL(r)},
		"fhirVersion":    "4.0.1",
		"instantiates":   []string{"http://hl7.org/fhir/uv/bulkdata/CapabilityStatement/bulk-data"},
		"format":         []string{"application/fhir+json", "json"},
		"rest": []map[string]any{{
			"mode": "server",
			"documentation": "Unknown search parameters are refused (400) unless Prefer: handling=lenient, which lists them in an " +
				"OperationOutcome entry. _count 0..1000 (default 20), _sort (several keys, - for descending), _include of the subject, " +
				"_revinclude and _has on Patient, chains on the patient (patient.identifier, subject:Patient.family, …), " +
				"_summary (count, true), _elements (both tag the resource SUBSETTED), _total (none, estimate, accurate; fhirpy's _totalMethod too), " +
				":missing on token, reference, date and quantity parameters, :exact on family and name, quantity prefixes on Observation value-quantity. " +
				"Paging is by keyset: the next link carries _page, an opaque position, so records written while a client pages never shift, repeat or skip one. " +
				"A POST [type] with search parameters in its query string is a conditional create, as If-None-Exist with that search. " +
				"429 and 503 answers carry Retry-After. POST [type]/_search takes the " +
				"parameters form-encoded. Batch and transaction Bundles are posted to the base, with or without a trailing slash. Ids are carehub's with '-' " +
				"for the prefix's '_' (pat-01k…); both forms are accepted on input.",
			"security": map[string]any{
				"service": []map[string]any{{"coding": []map[string]string{{"system": "http://terminology.hl7.org/CodeSystem/restful-security-service", "code": "OAuth"}},
					"text": "Authorization: Bearer <carehub API key or token>"}},
				"description": "Scopes: read:patients, read:observations, write:patients, write:observations; tenancy and test mode as every carehub route.",
			},
			"resource":    resources,
			"operation":   []operation{{"export", "http://hl7.org/fhir/uv/bulkdata/OperationDefinition/export"}},
			"interaction": []interaction{{"batch"}, {"transaction"}, {"history-system"}},
		}},
	}
	writeResource(w, http.StatusOK, cs)
}
