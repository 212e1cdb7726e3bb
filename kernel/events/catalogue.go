package events

//go:generate go test -run TestCatalogueFile -update .

// EventType describes one event type of the catalogue (served at GET /v1/event-types and kept in
// schemas/kafka/event-types.json).
type EventType struct {
	Type        string  `json:"type"`
	Source      string  `json:"source"` // the source events of this type carry
	Description string  `json:"description"`
	Payload     []Field `json:"payload"`
}

// Field is one payload field of an event type.
type Field struct {
	Name string `json:"name"`
	// Type is a JSON type (string, integer, number, boolean, object, array) or datetime, an
	// ISO 8601 UTC string.
	Type        string `json:"type"`
	Required    bool   `json:"required"`
	Description string `json:"description"`
}

// Payload field types.
const (
	FieldString   = "string"
	FieldInteger  = "integer"
	FieldNumber   = "number"
	FieldBoolean  = "boolean"
	FieldObject   = "object"
	FieldArray    = "array"
	FieldDateTime = "datetime"
)

// Catalogue lists every event type carehub emits, in a stable order. Events published by clients
// through publishEvent may carry any valid type and are not listed (their source is
// "integration"). Treat it as read-only; Lookup finds one entry.
var Catalogue = []EventType{
	{
		Type: TypeAssetSubmitted, Source: SourceSystem,
		Description: "An asset was submitted to the marketplace and awaits review.",
		Payload: []Field{
			{"assetId", FieldString, true, "the asset (ast_)"},
			{"publisherId", FieldString, true, "its publisher (pub_)"},
			{"name", FieldString, true, "the asset name"},
			{"version", FieldString, true, "the submitted version"},
			{"status", FieldString, true, "UNDER_REVIEW"},
		},
	},
	{
		Type: TypeAssetApproved, Source: SourceSystem,
		Description: "A marketplace review approved an asset; it is now listed.",
		Payload: []Field{
			{"assetId", FieldString, true, "the asset (ast_)"},
			{"publisherId", FieldString, true, "its publisher (pub_)"},
			{"status", FieldString, true, "APPROVED"},
			{"notes", FieldString, false, "review notes"},
		},
	},
	{
		Type: TypeAssetRejected, Source: SourceSystem,
		Description: "A marketplace review rejected an asset.",
		Payload: []Field{
			{"assetId", FieldString, true, "the asset (ast_)"},
			{"publisherId", FieldString, true, "its publisher (pub_)"},
			{"status", FieldString, true, "REJECTED"},
			{"reason", FieldString, false, "why it was rejected"},
		},
	},
	{
		Type: TypeAssetInstalled, Source: SourceSystem,
		Description: "An asset was installed into a project.",
		Payload: []Field{
			{"installationId", FieldString, true, "the installation (ins_)"},
			{"assetId", FieldString, true, "the installed asset (ast_)"},
			{"projectId", FieldString, true, "the project it was installed into (prj_)"},
			{"status", FieldString, true, "the installation status"},
		},
	},
	{
		Type: TypeAssetDeprecated, Source: SourceSystem,
		Description: "An asset was deprecated: it stays installed where it is but is no longer offered.",
		Payload: []Field{
			{"assetId", FieldString, true, "the asset (ast_)"},
			{"publisherId", FieldString, true, "its publisher (pub_)"},
			{"status", FieldString, true, "DEPRECATED"},
			{"reason", FieldString, false, "why it was deprecated"},
		},
	},
	{
		Type: TypeDeploymentStatusChanged, Source: SourceDeployment,
		Description: "A deployment moved between states (any transition, including its creation as PENDING).",
		Payload: []Field{
			{"deploymentId", FieldString, true, "the deployment (dep_)"},
			{"installationId", FieldString, false, "its installation (ins_)"},
			{"from", FieldString, true, "previous DeploymentStatus; empty on creation"},
			{"to", FieldString, true, "new DeploymentStatus"},
			{"reason", FieldString, false, "why it moved"},
		},
	},
	{
		Type: TypeAgentSessionUpdated, Source: SourceAgent,
		Description: "An agent session changed state (QUEUED, RUNNING, COMPLETED, FAILED, CANCELLED); feeds agentSessionUpdated subscriptions.",
		Payload: []Field{
			{"sessionId", FieldString, true, "the agent session (ses_)"},
			{"agentId", FieldString, true, "the agent (agt_)"},
			{"patientId", FieldString, true, "the patient context (pat_)"},
			{"status", FieldString, true, "RunStatus"},
			{"latencyMs", FieldInteger, false, "run latency once finished"},
			{"tokensUsed", FieldInteger, false, "tokens used once finished"},
			{"startedAt", FieldDateTime, true, "when the session started"},
			{"completedAt", FieldDateTime, false, "when it finished"},
		},
	},
	{
		Type: TypeAgentRunCompleted, Source: SourceAgent,
		Description: "An agent session ended successfully.",
		Payload: []Field{
			{"sessionId", FieldString, true, "the agent session (ses_)"},
			{"agentId", FieldString, true, "the agent (agt_)"},
			{"patientId", FieldString, true, "the patient context (pat_)"},
			{"status", FieldString, true, "COMPLETED"},
			{"latencyMs", FieldInteger, true, "run latency"},
			{"tokensUsed", FieldInteger, true, "tokens used"},
		},
	},
	{
		Type: TypeAgentRunFailed, Source: SourceAgent,
		Description: "An agent session ended in failure or was cancelled.",
		Payload: []Field{
			{"sessionId", FieldString, true, "the agent session (ses_)"},
			{"agentId", FieldString, true, "the agent (agt_)"},
			{"patientId", FieldString, true, "the patient context (pat_)"},
			{"status", FieldString, true, "FAILED or CANCELLED"},
			{"latencyMs", FieldInteger, true, "run latency"},
			{"tokensUsed", FieldInteger, true, "tokens used"},
			{"error", FieldString, false, "what went wrong"},
		},
	},
	{
		Type: TypeWorkflowRunUpdated, Source: SourceWorkflow,
		Description: "A workflow run changed state (QUEUED, RUNNING, COMPLETED, FAILED, CANCELLED); feeds workflowRunUpdated subscriptions.",
		Payload: []Field{
			{"runId", FieldString, true, "the run (run_)"},
			{"workflowId", FieldString, true, "the workflow (wf_)"},
			{"status", FieldString, true, "RunStatus"},
			{"durationMs", FieldInteger, false, "run duration once finished"},
			{"startedAt", FieldDateTime, true, "when the run started"},
			{"completedAt", FieldDateTime, false, "when it finished"},
		},
	},
	{
		Type: TypeWorkflowRunCompleted, Source: SourceWorkflow,
		Description: "A workflow run ended, with any terminal status (the spec's webhook shape, snake_case fields).",
		Payload: []Field{
			{"run_id", FieldString, true, "the run (run_)"},
			{"workflow_id", FieldString, true, "the workflow (wf_)"},
			{"status", FieldString, true, "COMPLETED, FAILED or CANCELLED"},
			{"duration_ms", FieldInteger, true, "run duration"},
			{"alert_generated", FieldBoolean, true, "whether the run raised a clinical alert"},
			{"severity", FieldString, true, "NONE, LOW, MEDIUM, HIGH or CRITICAL"},
		},
	},
	{
		Type: TypeWorkflowCompleted, Source: SourceWorkflow,
		Description: "A workflow run ended (the compact stream form of workflow.run.completed).",
		Payload: []Field{
			{"workflowId", FieldString, true, "the workflow (wf_)"},
			{"runId", FieldString, true, "the run (run_)"},
			{"status", FieldString, true, "COMPLETED, FAILED or CANCELLED"},
			{"durationMs", FieldInteger, true, "run duration"},
		},
	},
	{
		Type: TypeDeploymentPrediction, Source: SourceDeployment,
		Description: "A deployment that scores the observation stream ran its model on a patient's latest vitals after an observation arrived.",
		Payload: []Field{
			{"deploymentId", FieldString, true, "the deployment (dep_)"},
			{"patientId", FieldString, true, "the patient (pat_)"},
			{"observationId", FieldString, true, "the observation that arrived (obs_)"},
			{"model", FieldString, true, "SHA-256 of the model file that ran"},
			{"probability", FieldNumber, false, "the model's output, when it gives one value"},
		},
	},
	{
		Type: TypeDeviceObservationReceived, Source: SourceIntegration,
		Description: "An ingested device observation was stored.",
		Payload: []Field{
			{"observationId", FieldString, true, "the observation (obs_)"},
			{"patientId", FieldString, true, "the patient (pat_)"},
			{"code", FieldString, true, "LOINC code of the observation"},
			{"deviceType", FieldString, false, "the reporting device's type"},
			{"value", FieldNumber, false, "valueQuantity.value"},
			{"unit", FieldString, false, "valueQuantity.unit"},
			{"effectiveAt", FieldDateTime, false, "effectiveDateTime"},
		},
	},
	{
		Type: TypeDiagnosticResultReady, Source: SourceAgent,
		Description: "An agent or a workflow step produced a diagnostic report (source agent or workflow).",
		Payload: []Field{
			{"reportId", FieldString, true, "the report"},
			{"patientId", FieldString, true, "the patient (pat_)"},
			{"code", FieldString, true, "what was assessed (e.g. news2, qsofa)"},
			{"conclusion", FieldString, true, "the report's conclusion"},
			{"severity", FieldString, true, "NONE, LOW, MEDIUM, HIGH or CRITICAL"},
		},
	},
	{
		Type: TypeWebhookStatusChanged, Source: SourceSystem,
		Description: "A webhook subscription changed status, e.g. paused after 10 consecutive failed deliveries.",
		Payload: []Field{
			{"webhookId", FieldString, true, "the subscription (wh_)"},
			{"from", FieldString, true, "previous status"},
			{"to", FieldString, true, "new status: active, paused, failing or disabled"},
			{"failureCount", FieldInteger, true, "consecutive failed deliveries"},
			{"reason", FieldString, false, "why it changed"},
		},
	},
}

// Lookup returns the catalogue entry of typ.
func Lookup(typ string) (EventType, bool) {
	for _, et := range Catalogue {
		if et.Type == typ {
			return et, true
		}
	}
	return EventType{}, false
}
