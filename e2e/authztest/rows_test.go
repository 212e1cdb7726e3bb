package authztest

import (
	"fmt"

	"carehub/kernel/access"
)

// Access classes of a row besides scopes.
const (
	scoped   = ""         // any credential holding the row's scopes (none: any valid credential)
	public_  = "public"   // no credential needed
	platform = "platform" // the platform operator only
)

// row is one operation of the authorization matrix (DECISIONS §2, "Scopes per operation").
type row struct {
	op     string   // "query patient", "mutation runAgent", "subscription eventStream", "GET /v1/patients/{id}", "field T.f"
	scopes []string // all required; the last is the one a "lacking" credential misses
	access string   // scoped, public_ or platform
	tenant bool     // names one organization's resource: another tenant's credential gets NOT_FOUND
	real   bool     // names a patient: a test key gets NOT_FOUND for a real (non-synthetic) one
	// keyOnly: only an API key may call it (the token exchange, minting keys); a JWT gets FORBIDDEN.
	keyOnly bool
	gql     func(f *fixture) (string, map[string]any)
	rest    func(f *fixture) (method, path string, body any)
}

func q(query string, vars func(f *fixture) map[string]any) func(*fixture) (string, map[string]any) {
	return func(f *fixture) (string, map[string]any) {
		if vars == nil {
			return query, nil
		}
		return query, vars(f)
	}
}

func call(method string, path func(f *fixture) string, body func(f *fixture) any) func(*fixture) (string, string, any) {
	return func(f *fixture) (string, string, any) {
		var b any
		if body != nil {
			b = body(f)
		}
		return method, path(f), b
	}
}

func fixed(p string) func(*fixture) string { return func(*fixture) string { return p } }

func sc(scopes ...string) []string { return scopes }

// matrixTransaction is the body of the FHIR base's Bundle rows: a transaction creating a patient.
func matrixTransaction(*fixture) any {
	return map[string]any{"resourceType": "Bundle", "type": "transaction", "entry": []any{map[string]any{
		"request":  map[string]any{"method": "POST", "url": "Patient"},
		"resource": map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Matrix", "given": []string{"Row"}}}, "gender": "female", "birthDate": "1950-01-01"},
	}}}
}

// matrixSubscription is a websocket-channel Subscription to new observations of the fixture's
// patient.
func matrixSubscription(f *fixture) any {
	return map[string]any{"resourceType": "Subscription", "status": "requested", "reason": "matrix",
		"criteria": "https://carehub.example/fhir/SubscriptionTopic/observation-created",
		"_criteria": map[string]any{"extension": []any{map[string]any{"url": "http://hl7.org/fhir/uv/subscriptions-backport/StructureDefinition/backport-filter-criteria",
			"valueString": "Observation?patient=Patient/" + f.patient}}},
		"channel": map[string]any{"type": "websocket", "payload": "application/fhir+json"}}
}

// rows is the matrix, in the order it runs: operations that destroy their target come last.
var rows = []row{
	// GraphQL queries.
	{op: "query organization", tenant: true, gql: q(`query($id: ID!) { organization(id: $id) { id } }`, func(f *fixture) map[string]any { return map[string]any{"id": f.org} })},
	{op: "query organizations", gql: q(`{ organizations { id } }`, nil)},
	{op: "query project", tenant: true, gql: q(`query($id: ID!) { project(id: $id) { id } }`, func(f *fixture) map[string]any { return map[string]any{"id": f.project} })},
	{op: "query projects", gql: q(`query($o: ID!) { projects(organizationId: $o) { id } }`, func(f *fixture) map[string]any { return map[string]any{"o": f.org} })},
	{op: "query asset", gql: q(`query($id: ID!) { asset(id: $id) { id } }`, func(f *fixture) map[string]any { return map[string]any{"id": f.asset} })},
	{op: "query assets", gql: q(`{ assets(limit: 5) { id } }`, nil)},
	{op: "query publishers", gql: q(`{ publishers { id } }`, nil)},
	{op: "query agent", tenant: true, gql: q(`query($id: ID!) { agent(id: $id) { id } }`, func(f *fixture) map[string]any { return map[string]any{"id": f.agent} })},
	{op: "query agents", gql: q(`query($p: ID!) { agents(projectId: $p) { id } }`, func(f *fixture) map[string]any { return map[string]any{"p": f.project} })},
	{op: "query workflow", tenant: true, gql: q(`query($id: ID!) { workflow(id: $id) { id } }`, func(f *fixture) map[string]any { return map[string]any{"id": f.workflow} })},
	{op: "query workflows", gql: q(`query($p: ID!) { workflows(projectId: $p) { id } }`, func(f *fixture) map[string]any { return map[string]any{"p": f.project} })},
	{op: "query patient", scopes: sc(access.ReadPatients), tenant: true, real: true,
		gql: q(`query($id: ID!) { patient(id: $id) { id name encounters { id } } }`, func(f *fixture) map[string]any { return map[string]any{"id": f.patient} })},
	{op: "field FHIRPatient.observations", scopes: sc(access.ReadPatients, access.ReadObservations), tenant: true, real: true,
		gql: q(`query($id: ID!) { patient(id: $id) { id observations { id } } }`, func(f *fixture) map[string]any { return map[string]any{"id": f.patient} })},
	{op: "query patients", scopes: sc(access.ReadPatients), gql: q(`{ patients(limit: 5) { id } }`, nil)},
	{op: "query webhooks", gql: q(`query($p: ID!) { webhooks(projectId: $p) { id } }`, func(f *fixture) map[string]any { return map[string]any{"p": f.project} })},
	{op: "query events", gql: q(`query($p: ID!) { events(projectId: $p, limit: 5) { id } }`, func(f *fixture) map[string]any { return map[string]any{"p": f.project} })},
	{op: "query eventHistory", tenant: true, gql: q(`query($p: ID!) { eventHistory(projectId: $p, limit: 5, total: NONE) { events { id } nextCursor } }`, func(f *fixture) map[string]any { return map[string]any{"p": f.project} })},
	{op: "query eventStats", tenant: true, gql: q(`query($p: ID!) { eventStats(projectId: $p, from: "2020-01-01T00:00:00Z", groupBy: TYPE) { key count } }`, func(f *fixture) map[string]any { return map[string]any{"p": f.project} })},
	{op: "query apiVersion", gql: q(`{ apiVersion }`, nil)},
	{op: "query webhookDeliveries", scopes: sc(access.AdminOrg), tenant: true,
		gql: q(`query($w: ID!) { webhookDeliveries(webhookId: $w) { id } }`, func(f *fixture) map[string]any { return map[string]any{"w": f.webhook} })},
	{op: "query workflowRun", tenant: true, gql: q(`query($id: ID!) { workflowRun(id: $id) { id } }`, func(f *fixture) map[string]any { return map[string]any{"id": f.run} })},
	{op: "query deployment", tenant: true, gql: q(`query($id: ID!) { deployment(id: $id) { id } }`, func(f *fixture) map[string]any { return map[string]any{"id": f.deployment} })},
	{op: "query deployments", gql: q(`query($p: ID!) { deployments(projectId: $p) { id } }`, func(f *fixture) map[string]any { return map[string]any{"p": f.project} })},
	{op: "query installations", gql: q(`query($p: ID!) { installations(projectId: $p) { id } }`, func(f *fixture) map[string]any { return map[string]any{"p": f.project} })},

	// GraphQL mutations that leave their target in place.
	{op: "mutation submitAsset", scopes: sc(access.PublishAssets), gql: q(`mutation { submitAsset(input: {name: "Authz Probe", description: "matrix", version: "1.0.0", type: MODEL, category: "test", pricingType: FREE, supportEmail: "probe@example.com"}) { id status } }`, nil)},
	{op: "mutation installAsset", scopes: sc(access.AdminOrg), tenant: true,
		gql: q(`mutation($a: ID!, $p: ID!) { installAsset(assetId: $a, projectId: $p) { id } }`, func(f *fixture) map[string]any { return map[string]any{"a": f.asset, "p": f.project} })},
	{op: "mutation createDeployment", scopes: sc(access.AdminOrg), tenant: true,
		gql: q(`mutation($i: ID!) { createDeployment(installationId: $i, environment: "staging") { id } }`, func(f *fixture) map[string]any { return map[string]any{"i": f.installation} })},
	{op: "mutation createAgent", scopes: sc(access.ExecAgents), tenant: true,
		gql: q(`mutation($p: ID!) { createAgent(name: "authz probe", projectId: $p) { id } }`, func(f *fixture) map[string]any { return map[string]any{"p": f.project} })},
	{op: "mutation runAgent", scopes: sc(access.ExecAgents), tenant: true, real: true,
		gql: q(`mutation($a: ID!, $pt: String!) { runAgent(agentId: $a, patientId: $pt) { id status } }`, func(f *fixture) map[string]any { return map[string]any{"a": f.agent, "pt": f.patient} })},
	{op: "mutation createWorkflow", scopes: sc(access.ExecWorkflows), tenant: true,
		gql: q(`mutation($p: ID!) { createWorkflow(name: "authz probe", projectId: $p, steps: ["load_patient"]) { id } }`, func(f *fixture) map[string]any { return map[string]any{"p": f.project} })},
	{op: "mutation runWorkflow", scopes: sc(access.ExecWorkflows), tenant: true,
		gql: q(`mutation($w: ID!, $in: JSON) { runWorkflow(workflowId: $w, input: $in) { id } }`, func(f *fixture) map[string]any {
			return map[string]any{"w": f.workflow, "in": map[string]any{"patient_id": f.patient}}
		})},
	{op: "mutation createWebhook", scopes: sc(access.AdminOrg), tenant: true,
		gql: q(`mutation($p: ID!) { createWebhook(projectId: $p, url: "https://93.184.215.14/hook", events: ["agent.*"]) { id } }`, func(f *fixture) map[string]any { return map[string]any{"p": f.project} })},
	{op: "mutation publishEvent", scopes: sc(access.ExecWorkflows), tenant: true,
		gql: q(`mutation($p: ID!) { publishEvent(type: "authz.probe", payload: {}, projectId: $p) { id } }`, func(f *fixture) map[string]any { return map[string]any{"p": f.project} })},
	{op: "mutation updateWebhook", scopes: sc(access.AdminOrg), tenant: true,
		gql: q(`mutation($id: ID!) { updateWebhook(id: $id, events: ["agent.*", "workflow.*"]) { id } }`, func(f *fixture) map[string]any { return map[string]any{"id": f.webhook} })},
	{op: "mutation rotateWebhookSecret", scopes: sc(access.AdminOrg), tenant: true,
		gql: q(`mutation($id: ID!) { rotateWebhookSecret(id: $id) { id } }`, func(f *fixture) map[string]any { return map[string]any{"id": f.webhook} })},
	{op: "mutation redeliverWebhookDelivery", scopes: sc(access.AdminOrg), tenant: true,
		gql: q(`mutation($d: ID!) { redeliverWebhookDelivery(deliveryId: $d) { id } }`, func(f *fixture) map[string]any { return map[string]any{"d": f.delivery} })},
	{op: "mutation recoverWebhookDeliveries", scopes: sc(access.AdminOrg), tenant: true,
		gql: q(`mutation($w: ID!) { recoverWebhookDeliveries(webhookId: $w, since: "2020-01-01T00:00:00Z") }`, func(f *fixture) map[string]any { return map[string]any{"w": f.webhook} })},
	{op: "mutation pauseWorkflow", scopes: sc(access.ExecWorkflows), tenant: true,
		gql: q(`mutation($id: ID!) { pauseWorkflow(id: $id) { id } }`, func(f *fixture) map[string]any { return map[string]any{"id": f.workflow} })},
	{op: "mutation resumeWorkflow", scopes: sc(access.ExecWorkflows), tenant: true,
		gql: q(`mutation($id: ID!) { resumeWorkflow(id: $id) { id } }`, func(f *fixture) map[string]any { return map[string]any{"id": f.workflow} })},
	{op: "mutation cancelWorkflowRun", scopes: sc(access.ExecWorkflows), tenant: true,
		gql: q(`mutation($id: ID!) { cancelWorkflowRun(runId: $id) { id } }`, func(f *fixture) map[string]any { return map[string]any{"id": f.run} })},
	{op: "mutation reviewAsset", access: platform,
		gql: q(`mutation($a: ID!) { reviewAsset(assetId: $a, decision: "APPROVED") { id } }`, func(f *fixture) map[string]any { return map[string]any{"a": f.reviewAsset} })},

	// GraphQL subscriptions.
	{op: "subscription agentSessionUpdated", scopes: sc(access.ExecAgents), tenant: true,
		gql: q(`subscription($a: ID!) { agentSessionUpdated(agentId: $a) { id } }`, func(f *fixture) map[string]any { return map[string]any{"a": f.agent} })},
	{op: "subscription workflowRunUpdated", scopes: sc(access.ExecWorkflows), tenant: true,
		gql: q(`subscription($w: ID!) { workflowRunUpdated(workflowId: $w) { id } }`, func(f *fixture) map[string]any { return map[string]any{"w": f.workflow} })},
	{op: "subscription eventStream", tenant: true,
		gql: q(`subscription($p: ID!) { eventStream(projectId: $p) { id } }`, func(f *fixture) map[string]any { return map[string]any{"p": f.project} })},
	{op: "subscription deploymentStatusChanged", tenant: true,
		gql: q(`subscription($d: ID!) { deploymentStatusChanged(deploymentId: $d) { id } }`, func(f *fixture) map[string]any { return map[string]any{"d": f.deployment} })},

	// REST, public.
	{op: "GET /v1/openapi.json", access: public_, rest: call("GET", fixed("/v1/openapi.json"), nil)},
	{op: "GET /v1/event-types", access: public_, rest: call("GET", fixed("/v1/event-types"), nil)},
	{op: "GET /.well-known/jwks.json", access: public_, rest: call("GET", fixed("/.well-known/jwks.json"), nil)},

	// REST, the spec's routes and their extensions.
	{op: "GET /v1/organizations", rest: call("GET", fixed("/v1/organizations"), nil)},
	{op: "GET /v1/organizations/{id}", tenant: true, rest: call("GET", func(f *fixture) string { return "/v1/organizations/" + f.org }, nil)},
	{op: "GET /v1/projects", tenant: true, rest: call("GET", func(f *fixture) string { return "/v1/projects?organizationId=" + f.org }, nil)},
	{op: "GET /v1/projects/{id}", tenant: true, rest: call("GET", func(f *fixture) string { return "/v1/projects/" + f.project }, nil)},
	{op: "GET /v1/assets", rest: call("GET", fixed("/v1/assets?type=agent&limit=5"), nil)},
	{op: "GET /v1/agents/{id}", tenant: true, rest: call("GET", func(f *fixture) string { return "/v1/agents/" + f.agent }, nil)},
	{op: "GET /v1/workflows/{id}", tenant: true, rest: call("GET", func(f *fixture) string { return "/v1/workflows/" + f.workflow }, nil)},
	{op: "GET /v1/workflow-runs/{id}", tenant: true, rest: call("GET", func(f *fixture) string { return "/v1/workflow-runs/" + f.run }, nil)},
	{op: "GET /v1/deployments/{id}", tenant: true, rest: call("GET", func(f *fixture) string { return "/v1/deployments/" + f.deployment }, nil)},
	{op: "GET /v1/events", tenant: true, rest: call("GET", func(f *fixture) string { return "/v1/events?projectId=" + f.project }, nil)},
	{op: "GET /v1/events/export", tenant: true, rest: call("GET", func(f *fixture) string { return "/v1/events/export?projectId=" + f.project }, nil)},
	{op: "GET /v1/events/stats", tenant: true, rest: call("GET", func(f *fixture) string {
		return "/v1/events/stats?from=2020-01-01T00:00:00Z&groupBy=type&projectId=" + f.project
	}, nil)},
	{op: "GET /v1/webhooks", tenant: true, rest: call("GET", func(f *fixture) string { return "/v1/webhooks?projectId=" + f.project }, nil)},
	{op: "POST /api/v1/workflows/runs", scopes: sc(access.ExecWorkflows), tenant: true, rest: call("POST", fixed("/api/v1/workflows/runs"), func(f *fixture) any {
		return map[string]any{"workflow_id": f.workflow, "trigger": "manual", "input": map[string]any{"patient_id": f.patient}}
	})},
	{op: "POST /v1/events", scopes: sc(access.ExecWorkflows), tenant: true, rest: call("POST", fixed("/v1/events"), func(f *fixture) any {
		return []any{map[string]any{"type": "authz.probe", "projectId": f.project, "payload": map[string]any{}}}
	})},
	{op: "POST /v1/auth/token", keyOnly: true, rest: call("POST", fixed("/v1/auth/token"), func(*fixture) any { return map[string]any{"scope": []string{}} })},

	// REST, FHIR patients and observations.
	{op: "POST /v1/patients", scopes: sc(access.WritePatients), rest: call("POST", fixed("/v1/patients"), func(*fixture) any {
		return map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Probe", "given": []string{"Authz"}}}, "gender": "unknown"}
	})},
	{op: "PUT /v1/patients/{id}", scopes: sc(access.WritePatients), tenant: true, real: true,
		rest: call("PUT", func(f *fixture) string { return "/v1/patients/" + f.patient }, func(f *fixture) any {
			return map[string]any{"resourceType": "Patient", "id": f.patient, "name": []any{map[string]any{"family": "Probe", "given": []string{"Authz"}}}, "gender": "unknown"}
		})},
	{op: "GET /v1/assets/{id}/model", rest: call("GET", func(f *fixture) string { return "/v1/assets/" + f.asset + "/model" }, nil)},
	{op: "PUT /v1/assets/{id}/model", scopes: sc(access.PublishAssets), rest: call("PUT", func(f *fixture) string { return "/v1/assets/" + f.reviewAsset + "/model" }, nil)},
	{op: "POST /v1/deployments/{id}/invoke", scopes: sc(access.ExecAgents), tenant: true,
		rest: call("POST", func(f *fixture) string { return "/v1/deployments/" + f.deployment + "/invoke" }, func(f *fixture) any {
			return map[string]any{"vitals": map[string]any{"respiratory_rate": 16, "spo2": 97, "oxygen_flow": 0, "systolic_bp": 124, "heart_rate": 72, "gcs": 15, "temperature": 36.8}}
		})},
	{op: "GET /v1/patients", scopes: sc(access.ReadPatients), rest: call("GET", fixed("/v1/patients?limit=5"), nil)},
	{op: "GET /v1/patients/{id}", scopes: sc(access.ReadPatients), tenant: true, real: true,
		rest: call("GET", func(f *fixture) string { return "/v1/patients/" + f.patient }, nil)},
	{op: "GET /v1/patients/{id}/observations", scopes: sc(access.ReadObservations), tenant: true, real: true,
		rest: call("GET", func(f *fixture) string { return "/v1/patients/" + f.patient + "/observations" }, nil)},
	{op: "POST /v1/observations", scopes: sc(access.WriteObservations), rest: call("POST", fixed("/v1/observations"), func(f *fixture) any {
		return map[string]any{"resourceType": "Observation", "status": "final",
			"code":              map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "8867-4"}}},
			"subject":           map[string]any{"reference": "Patient/" + f.patient},
			"valueQuantity":     map[string]any{"value": 80, "unit": "/min"},
			"effectiveDateTime": "2024-05-01T12:00:00Z"}
	})},

	// The FHIR R4 base (errors are OperationOutcomes carrying carehub's code in issue.details).
	{op: "GET /fhir/R4/metadata", access: public_, rest: call("GET", fixed("/fhir/R4/metadata"), nil)},
	{op: "GET /fhir/R4/{type:[A-Z][A-Za-z]+}", scopes: sc(access.ReadPatients), rest: call("GET", fixed("/fhir/R4/Patient?_count=5"), nil)},
	{op: "POST /fhir/R4/{type:[A-Z][A-Za-z]+}/_search", scopes: sc(access.ReadPatients), rest: call("POST", fixed("/fhir/R4/Patient/_search?_count=5"), nil)},
	{op: "GET /fhir/R4/{type:[A-Z][A-Za-z]+}/{id}", scopes: sc(access.ReadPatients), tenant: true, real: true,
		rest: call("GET", func(f *fixture) string { return "/fhir/R4/Patient/" + f.patient }, nil)},
	{op: "GET /fhir/R4/{type:[A-Z][A-Za-z]+}/{id}/_history", scopes: sc(access.ReadPatients), tenant: true, real: true,
		rest: call("GET", func(f *fixture) string { return "/fhir/R4/Patient/" + f.patient + "/_history" }, nil)},
	{op: "GET /fhir/R4/{type:[A-Z][A-Za-z]+}/{id}/_history/{version}", scopes: sc(access.ReadPatients), tenant: true, real: true,
		rest: call("GET", func(f *fixture) string { return "/fhir/R4/Patient/" + f.patient + "/_history/1" }, nil)},
	{op: "GET /fhir/R4/Patient/{id}/$everything", scopes: sc(access.ReadPatients), tenant: true, real: true,
		rest: call("GET", func(f *fixture) string { return "/fhir/R4/Patient/" + f.patient + "/$everything" }, nil)},
	{op: "POST /fhir/R4/{type:[A-Z][A-Za-z]+}", scopes: sc(access.WriteObservations), rest: call("POST", fixed("/fhir/R4/Observation"), func(f *fixture) any {
		return map[string]any{"resourceType": "Observation", "status": "final",
			"code":              map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "8867-4"}}},
			"subject":           map[string]any{"reference": "Patient/" + f.patient},
			"valueQuantity":     map[string]any{"value": 80, "unit": "/min", "system": "http://unitsofmeasure.org", "code": "/min"},
			"effectiveDateTime": "2024-05-01T12:00:00Z"}
	})},
	{op: "POST /fhir/R4", scopes: sc(access.WritePatients), rest: call("POST", fixed("/fhir/R4"), matrixTransaction)},
	{op: "POST /fhir/R4/", scopes: sc(access.WritePatients), rest: call("POST", fixed("/fhir/R4/"), matrixTransaction)},
	{op: "GET /fhir/R4/{type:[A-Z][A-Za-z]+}/_history", scopes: sc(access.ReadPatients), rest: call("GET", fixed("/fhir/R4/Patient/_history?_count=5"), nil)},
	// Bulk Data export (without Prefer: respond-async the holder's kick-off is a 400, after the
	// scope check; the ids are nobody's, so every credential holding the scope gets 404 alike).
	{op: "GET /fhir/R4/$export", scopes: sc(access.ReadPatients), rest: call("GET", fixed("/fhir/R4/$export?_type=Patient"), nil)},
	{op: "GET /fhir/R4/Patient/$export", scopes: sc(access.ReadPatients), rest: call("GET", fixed("/fhir/R4/Patient/$export"), nil)},
	{op: "GET /fhir/R4/Group/{id}/$export", scopes: sc(access.ReadPatients), rest: call("GET", fixed("/fhir/R4/Group/res-01jz0000000000000000000000/$export"), nil)},
	{op: "POST /fhir/R4/$export", scopes: sc(access.ReadPatients), rest: call("POST", fixed("/fhir/R4/$export"), matrixExportParams)},
	{op: "POST /fhir/R4/Patient/$export", scopes: sc(access.ReadPatients), rest: call("POST", fixed("/fhir/R4/Patient/$export"), matrixExportParams)},
	{op: "POST /fhir/R4/Group/{id}/$export", scopes: sc(access.ReadPatients), rest: call("POST", fixed("/fhir/R4/Group/res-01jz0000000000000000000000/$export"), matrixExportParams)},
	{op: "GET /fhir/R4/$export-status/{id}", scopes: sc(access.ReadPatients), rest: call("GET", fixed("/fhir/R4/$export-status/bex-01jz0000000000000000000000"), nil)},
	{op: "GET /fhir/R4/$export-file/{id}/{file}", scopes: sc(access.ReadPatients), rest: call("GET", fixed("/fhir/R4/$export-file/bex-01jz0000000000000000000000/Patient.1.ndjson"), nil)},
	{op: "DELETE /fhir/R4/$export-status/{id}", scopes: sc(access.ReadPatients), rest: call("DELETE", fixed("/fhir/R4/$export-status/bex-01jz0000000000000000000000"), nil)},
	// FHIR Subscriptions: every topic is about patients' Observations and RiskAssessments. The
	// topic catalogue is any credential's; the websocket channel is authenticated by its binding
	// token, not by a credential. DELETE names nobody's subscription: the fixture's is read below.
	{op: "GET /fhir/R4/SubscriptionTopic", rest: call("GET", fixed("/fhir/R4/SubscriptionTopic"), nil)},
	{op: "GET /fhir/R4/SubscriptionTopic/{id}", rest: call("GET", fixed("/fhir/R4/SubscriptionTopic/observation-created"), nil)},
	{op: "POST /fhir/R4/Subscription", scopes: sc(access.ReadPatients, access.ReadObservations), rest: call("POST", fixed("/fhir/R4/Subscription"), matrixSubscription)},
	{op: "GET /fhir/R4/Subscription", scopes: sc(access.ReadPatients, access.ReadObservations), rest: call("GET", fixed("/fhir/R4/Subscription"), nil)},
	{op: "GET /fhir/R4/Subscription/{id}", scopes: sc(access.ReadPatients, access.ReadObservations), tenant: true,
		rest: call("GET", func(f *fixture) string { return "/fhir/R4/Subscription/" + f.subscription }, nil)},
	{op: "PUT /fhir/R4/Subscription/{id}", scopes: sc(access.ReadPatients, access.ReadObservations), tenant: true,
		rest: call("PUT", func(f *fixture) string { return "/fhir/R4/Subscription/" + f.subscription }, matrixSubscription)},
	{op: "GET /fhir/R4/Subscription/{id}/$status", scopes: sc(access.ReadPatients, access.ReadObservations), tenant: true,
		rest: call("GET", func(f *fixture) string { return "/fhir/R4/Subscription/" + f.subscription + "/$status" }, nil)},
	{op: "POST /fhir/R4/Subscription/{id}/$status", scopes: sc(access.ReadPatients, access.ReadObservations), tenant: true,
		rest: call("POST", func(f *fixture) string { return "/fhir/R4/Subscription/" + f.subscription + "/$status" }, nil)},
	{op: "GET /fhir/R4/Subscription/{id}/$events", scopes: sc(access.ReadPatients, access.ReadObservations), tenant: true,
		rest: call("GET", func(f *fixture) string { return "/fhir/R4/Subscription/" + f.subscription + "/$events" }, nil)},
	{op: "POST /fhir/R4/Subscription/{id}/$events", scopes: sc(access.ReadPatients, access.ReadObservations), tenant: true,
		rest: call("POST", func(f *fixture) string { return "/fhir/R4/Subscription/" + f.subscription + "/$events" }, nil)},
	{op: "GET /fhir/R4/Subscription/{id}/$get-ws-binding-token", scopes: sc(access.ReadPatients, access.ReadObservations), tenant: true,
		rest: call("GET", func(f *fixture) string { return "/fhir/R4/Subscription/" + f.subscription + "/$get-ws-binding-token" }, nil)},
	{op: "POST /fhir/R4/Subscription/{id}/$get-ws-binding-token", scopes: sc(access.ReadPatients, access.ReadObservations), tenant: true,
		rest: call("POST", func(f *fixture) string { return "/fhir/R4/Subscription/" + f.subscription + "/$get-ws-binding-token" }, nil)},
	{op: "DELETE /fhir/R4/Subscription/{id}", scopes: sc(access.ReadPatients, access.ReadObservations),
		rest: call("DELETE", fixed("/fhir/R4/Subscription/sub-01jz0000000000000000000000"), nil)},
	{op: "GET /fhir/R4/$subscription-websocket", access: public_, rest: call("GET", fixed("/fhir/R4/$subscription-websocket"), nil)},
	// The system history holds every type: the read scopes of all of them.
	{op: "GET /fhir/R4/_history", scopes: sc(access.ReadPatients, access.ReadObservations), rest: call("GET", fixed("/fhir/R4/_history?_count=5"), nil)},

	// REST, webhook management.
	{op: "GET /v1/webhooks/deliveries/{id}", scopes: sc(access.AdminOrg), tenant: true, rest: call("GET", func(f *fixture) string { return "/v1/webhooks/deliveries/" + f.delivery }, nil)},
	{op: "POST /v1/webhooks/deliveries/{id}/redeliver", scopes: sc(access.AdminOrg), tenant: true, rest: call("POST", func(f *fixture) string { return "/v1/webhooks/deliveries/" + f.delivery + "/redeliver" }, nil)},
	{op: "POST /v1/webhooks", scopes: sc(access.AdminOrg), tenant: true, rest: call("POST", fixed("/v1/webhooks"), func(f *fixture) any {
		return map[string]any{"projectId": f.project, "url": "https://93.184.215.14/hook", "events": []string{"agent.*"}}
	})},
	// Reading one subscription is what the list (any credential) shows of it, secret masked.
	{op: "GET /v1/webhooks/{id}", tenant: true, rest: call("GET", func(f *fixture) string { return "/v1/webhooks/" + f.webhook }, nil)},
	{op: "PATCH /v1/webhooks/{id}", scopes: sc(access.AdminOrg), tenant: true, rest: call("PATCH", func(f *fixture) string { return "/v1/webhooks/" + f.webhook }, func(*fixture) any {
		return map[string]any{"events": []string{"agent.*"}}
	})},
	{op: "POST /v1/webhooks/{id}/rotate-secret", scopes: sc(access.AdminOrg), tenant: true, rest: call("POST", func(f *fixture) string { return "/v1/webhooks/" + f.webhook + "/rotate-secret" }, nil)},
	{op: "GET /v1/webhooks/{id}/deliveries", scopes: sc(access.AdminOrg), tenant: true, rest: call("GET", func(f *fixture) string { return "/v1/webhooks/" + f.webhook + "/deliveries" }, nil)},
	{op: "POST /v1/webhooks/{id}/recover", scopes: sc(access.AdminOrg), tenant: true, rest: call("POST", func(f *fixture) string { return "/v1/webhooks/" + f.webhook + "/recover" }, func(*fixture) any {
		return map[string]any{"since": "2020-01-01T00:00:00Z"}
	})},
	{op: "POST /api/v1/webhooks/test", scopes: sc(access.AdminOrg), tenant: true, rest: call("POST", fixed("/api/v1/webhooks/test"), func(f *fixture) any {
		return map[string]any{"webhookId": f.webhook}
	})},

	// REST, API keys and the audit log (carehub extensions).
	{op: "GET /v1/api-keys", scopes: sc(access.AdminOrg), rest: call("GET", fixed("/v1/api-keys"), nil)},
	{op: "POST /v1/api-keys", keyOnly: true, scopes: sc(access.AdminOrg), rest: call("POST", fixed("/v1/api-keys"), func(*fixture) any { return map[string]any{"mode": "test", "name": "authz probe"} })},
	{op: "GET /v1/api-keys/{id}", scopes: sc(access.AdminOrg), tenant: true, rest: call("GET", func(f *fixture) string { return "/v1/api-keys/" + f.spareKey(0) }, nil)},
	{op: "POST /v1/api-keys/{id}/rotate", keyOnly: true, scopes: sc(access.AdminOrg), tenant: true, rest: call("POST", func(f *fixture) string { return "/v1/api-keys/" + f.spareKey(1) + "/rotate" }, nil)},
	{op: "GET /v1/audit", scopes: sc(access.AdminOrg), rest: call("GET", fixed("/v1/audit?limit=5"), nil)},
	{op: "GET /v1/organizations/{id}/retention", scopes: sc(access.AdminOrg), tenant: true, rest: call("GET", func(f *fixture) string { return "/v1/organizations/" + f.org + "/retention" }, nil)},
	{op: "PUT /v1/organizations/{id}/retention", access: platform, rest: call("PUT", func(f *fixture) string { return "/v1/organizations/" + f.org + "/retention" }, func(*fixture) any {
		return map[string]any{} // both logs kept forever
	})},
	{op: "GET /v1/audit/export", scopes: sc(access.AdminOrg), rest: call("GET", fixed("/v1/audit/export?from=2020-01-01T00:00:00Z&to=2020-01-02T00:00:00Z"), nil)},

	{op: "PUT /fhir/R4/{type:[A-Z][A-Za-z]+}/{id}", scopes: sc(access.WritePatients), tenant: true, real: true,
		rest: call("PUT", func(f *fixture) string { return "/fhir/R4/Patient/" + f.patient }, func(f *fixture) any {
			return map[string]any{"resourceType": "Patient", "id": f.patient, "name": []any{map[string]any{"family": "Matrix", "given": []string{"Row"}}},
				"gender": "female", "birthDate": "1950-01-01"}
		})},
	// Operations that destroy or end their target.
	{op: "POST /v1/api-keys/{id}/revoke", scopes: sc(access.AdminOrg), tenant: true, rest: call("POST", func(f *fixture) string { return "/v1/api-keys/" + f.spareKey(2) + "/revoke" }, nil)},
	{op: "DELETE /v1/api-keys/{id}", scopes: sc(access.AdminOrg), tenant: true, rest: call("DELETE", func(f *fixture) string { return "/v1/api-keys/" + f.spareKey(3) }, nil)},
	{op: "DELETE /v1/webhooks/{id}", scopes: sc(access.AdminOrg), tenant: true, rest: call("DELETE", func(f *fixture) string { return "/v1/webhooks/" + f.spareWebhook(0) }, nil)},
	{op: "mutation deleteWebhook", scopes: sc(access.AdminOrg), tenant: true,
		gql: q(`mutation($id: ID!) { deleteWebhook(id: $id) }`, func(f *fixture) map[string]any { return map[string]any{"id": f.spareWebhook(1)} })},
	{op: "mutation archiveWorkflow", scopes: sc(access.ExecWorkflows), tenant: true,
		gql: q(`mutation($id: ID!) { archiveWorkflow(id: $id) { id } }`, func(f *fixture) map[string]any { return map[string]any{"id": f.spareWorkflow()} })},
	{op: "mutation stopDeployment", scopes: sc(access.AdminOrg), tenant: true,
		gql: q(`mutation($id: ID!) { stopDeployment(id: $id) { id } }`, func(f *fixture) map[string]any { return map[string]any{"id": f.deployment} })},
	// The demo patient has observations: an authorized delete is refused with 409 (referential
	// integrity) and the patient stays for the other rows; api/fhir's TestDelete deletes one.
	{op: "DELETE /fhir/R4/{type:[A-Z][A-Za-z]+}/{id}", scopes: sc(access.WritePatients), tenant: true, real: true,
		rest: call("DELETE", func(f *fixture) string { return "/fhir/R4/Patient/" + f.patient }, nil)},
	{op: "mutation deprecateAsset", access: platform,
		gql: q(`mutation($a: ID!) { deprecateAsset(assetId: $a) { id } }`, func(f *fixture) map[string]any { return map[string]any{"a": f.asset} })},
}

func (r row) String() string { return fmt.Sprintf("%s %v %s", r.op, r.scopes, r.access) }

// matrixExportParams is a POST kick-off's Parameters body.
func matrixExportParams(*fixture) any {
	return map[string]any{"resourceType": "Parameters", "parameter": []any{map[string]any{"name": "_type", "valueString": "Patient"}}}
}
