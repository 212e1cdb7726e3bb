package events

import "time"

// The types of the catalogue, one constant each: emitters and consumers name a type through these,
// never as a string literal, so a renamed type is a compile error rather than a silent miss.
const (
	TypeAssetSubmitted            = "asset.submitted"
	TypeAssetApproved             = "asset.approved"
	TypeAssetRejected             = "asset.rejected"
	TypeAssetInstalled            = "asset.installed"
	TypeAssetDeprecated           = "asset.deprecated"
	TypeDeploymentStatusChanged   = "deployment.status_changed"
	TypeDeploymentPrediction      = "deployment.prediction"
	TypeAgentSessionUpdated       = "agent.session.updated"
	TypeAgentRunCompleted         = "agent.run_completed"
	TypeAgentRunFailed            = "agent.run.failed"
	TypeWorkflowRunUpdated        = "workflow.run.updated"
	TypeWorkflowRunCompleted      = "workflow.run.completed"
	TypeWorkflowCompleted         = "workflow.completed"
	TypeDeviceObservationReceived = "device.observation_received"
	TypeDiagnosticResultReady     = "diagnostic.result_ready"
	TypeWebhookStatusChanged      = "webhook.status_changed"
)

// Payloads maps each catalogue type to its payload struct (a zero value). TestPayloadsMatchSchemas
// checks every struct against the type's fields in schemas/kafka/event-types.json: same names,
// required exactly where the tag has no omitempty, and JSON types that match.
var Payloads = map[string]any{
	TypeAssetSubmitted:            AssetSubmitted{},
	TypeAssetApproved:             AssetApproved{},
	TypeAssetRejected:             AssetRejected{},
	TypeAssetInstalled:            AssetInstalled{},
	TypeAssetDeprecated:           AssetDeprecated{},
	TypeDeploymentStatusChanged:   DeploymentStatusChanged{},
	TypeDeploymentPrediction:      DeploymentPrediction{},
	TypeAgentSessionUpdated:       AgentSessionUpdated{},
	TypeAgentRunCompleted:         AgentRunCompleted{},
	TypeAgentRunFailed:            AgentRunFailed{},
	TypeWorkflowRunUpdated:        WorkflowRunUpdated{},
	TypeWorkflowRunCompleted:      WorkflowRunCompleted{},
	TypeWorkflowCompleted:         WorkflowCompleted{},
	TypeDeviceObservationReceived: DeviceObservationReceived{},
	TypeDiagnosticResultReady:     DiagnosticResultReady{},
	TypeWebhookStatusChanged:      WebhookStatusChanged{},
}

// AssetSubmitted is the payload of TypeAssetSubmitted: an asset was submitted to the marketplace and awaits review.
type AssetSubmitted struct {
	AssetID     string `json:"assetId"`     // the asset (ast_)
	PublisherID string `json:"publisherId"` // its publisher (pub_)
	Name        string `json:"name"`        // the asset name
	Version     string `json:"version"`     // the submitted version
	Status      string `json:"status"`      // UNDER_REVIEW
}

// AssetApproved is the payload of TypeAssetApproved: a marketplace review approved an asset; it is now listed.
type AssetApproved struct {
	AssetID     string `json:"assetId"`         // the asset (ast_)
	PublisherID string `json:"publisherId"`     // its publisher (pub_)
	Status      string `json:"status"`          // APPROVED
	Notes       string `json:"notes,omitempty"` // review notes
}

// AssetRejected is the payload of TypeAssetRejected: a marketplace review rejected an asset.
type AssetRejected struct {
	AssetID     string `json:"assetId"`          // the asset (ast_)
	PublisherID string `json:"publisherId"`      // its publisher (pub_)
	Status      string `json:"status"`           // REJECTED
	Reason      string `json:"reason,omitempty"` // why it was rejected
}

// AssetInstalled is the payload of TypeAssetInstalled: an asset was installed into a project.
type AssetInstalled struct {
	InstallationID string `json:"installationId"` // the installation (ins_)
	AssetID        string `json:"assetId"`        // the installed asset (ast_)
	ProjectID      string `json:"projectId"`      // the project it was installed into (prj_)
	Status         string `json:"status"`         // the installation status
}

// AssetDeprecated is the payload of TypeAssetDeprecated: an asset was deprecated: it stays installed where it is but is no longer offered.
type AssetDeprecated struct {
	AssetID     string `json:"assetId"`          // the asset (ast_)
	PublisherID string `json:"publisherId"`      // its publisher (pub_)
	Status      string `json:"status"`           // DEPRECATED
	Reason      string `json:"reason,omitempty"` // why it was deprecated
}

// DeploymentStatusChanged is the payload of TypeDeploymentStatusChanged: a deployment moved between states (any transition, including its creation as PENDING).
type DeploymentStatusChanged struct {
	DeploymentID   string `json:"deploymentId"`             // the deployment (dep_)
	InstallationID string `json:"installationId,omitempty"` // its installation (ins_)
	From           string `json:"from"`                     // previous DeploymentStatus; empty on creation
	To             string `json:"to"`                       // new DeploymentStatus
	Reason         string `json:"reason,omitempty"`         // why it moved
}

// AgentSessionUpdated is the payload of TypeAgentSessionUpdated: an agent session changed state (QUEUED, RUNNING, COMPLETED, FAILED, CANCELLED); feeds agentSessionUpdated subscriptions.
type AgentSessionUpdated struct {
	SessionID   string     `json:"sessionId"`             // the agent session (ses_)
	AgentID     string     `json:"agentId"`               // the agent (agt_)
	PatientID   string     `json:"patientId"`             // the patient context (pat_)
	Status      string     `json:"status"`                // RunStatus
	LatencyMs   *int64     `json:"latencyMs,omitempty"`   // run latency once finished
	TokensUsed  *int64     `json:"tokensUsed,omitempty"`  // tokens used once finished
	StartedAt   time.Time  `json:"startedAt"`             // when the session started
	CompletedAt *time.Time `json:"completedAt,omitempty"` // when it finished
}

// AgentRunCompleted is the payload of TypeAgentRunCompleted: an agent session ended successfully.
type AgentRunCompleted struct {
	SessionID  string `json:"sessionId"`  // the agent session (ses_)
	AgentID    string `json:"agentId"`    // the agent (agt_)
	PatientID  string `json:"patientId"`  // the patient context (pat_)
	Status     string `json:"status"`     // COMPLETED
	LatencyMs  int64  `json:"latencyMs"`  // run latency
	TokensUsed int64  `json:"tokensUsed"` // tokens used
}

// AgentRunFailed is the payload of TypeAgentRunFailed: an agent session ended in failure or was cancelled.
type AgentRunFailed struct {
	SessionID  string `json:"sessionId"`       // the agent session (ses_)
	AgentID    string `json:"agentId"`         // the agent (agt_)
	PatientID  string `json:"patientId"`       // the patient context (pat_)
	Status     string `json:"status"`          // FAILED or CANCELLED
	LatencyMs  int64  `json:"latencyMs"`       // run latency
	TokensUsed int64  `json:"tokensUsed"`      // tokens used
	Error      string `json:"error,omitempty"` // what went wrong
}

// WorkflowRunUpdated is the payload of TypeWorkflowRunUpdated: a workflow run changed state (QUEUED, RUNNING, COMPLETED, FAILED, CANCELLED); feeds workflowRunUpdated subscriptions.
type WorkflowRunUpdated struct {
	RunID       string     `json:"runId"`                 // the run (run_)
	WorkflowID  string     `json:"workflowId"`            // the workflow (wf_)
	Status      string     `json:"status"`                // RunStatus
	DurationMs  *int64     `json:"durationMs,omitempty"`  // run duration once finished
	StartedAt   time.Time  `json:"startedAt"`             // when the run started
	CompletedAt *time.Time `json:"completedAt,omitempty"` // when it finished
}

// WorkflowRunCompleted is the payload of TypeWorkflowRunCompleted: a workflow run ended, with any terminal status (the spec's webhook shape, snake_case fields).
type WorkflowRunCompleted struct {
	RunID          string `json:"run_id"`          // the run (run_)
	WorkflowID     string `json:"workflow_id"`     // the workflow (wf_)
	Status         string `json:"status"`          // COMPLETED, FAILED or CANCELLED
	DurationMs     int64  `json:"duration_ms"`     // run duration
	AlertGenerated bool   `json:"alert_generated"` // whether the run raised a clinical alert
	Severity       string `json:"severity"`        // NONE, LOW, MEDIUM, HIGH or CRITICAL
}

// WorkflowCompleted is the payload of TypeWorkflowCompleted: a workflow run ended (the compact stream form of workflow.run.completed).
type WorkflowCompleted struct {
	WorkflowID string `json:"workflowId"` // the workflow (wf_)
	RunID      string `json:"runId"`      // the run (run_)
	Status     string `json:"status"`     // COMPLETED, FAILED or CANCELLED
	DurationMs int64  `json:"durationMs"` // run duration
}

// DeploymentPrediction is the payload of TypeDeploymentPrediction: a deployment that scores the observation stream ran its model on a patient's latest vitals after an observation arrived.
type DeploymentPrediction struct {
	DeploymentID  string   `json:"deploymentId"`          // the deployment (dep_)
	PatientID     string   `json:"patientId"`             // the patient (pat_)
	ObservationID string   `json:"observationId"`         // the observation that arrived (obs_)
	Model         string   `json:"model"`                 // SHA-256 of the model file that ran
	Probability   *float64 `json:"probability,omitempty"` // the model's output, when it gives one value
}

// DeviceObservationReceived is the payload of TypeDeviceObservationReceived: an ingested device observation was stored.
type DeviceObservationReceived struct {
	ObservationID string     `json:"observationId"`         // the observation (obs_)
	PatientID     string     `json:"patientId"`             // the patient (pat_)
	Code          string     `json:"code"`                  // LOINC code of the observation
	DeviceType    string     `json:"deviceType,omitempty"`  // the reporting device's type
	Value         *float64   `json:"value,omitempty"`       // valueQuantity.value
	Unit          string     `json:"unit,omitempty"`        // valueQuantity.unit
	EffectiveAt   *time.Time `json:"effectiveAt,omitempty"` // effectiveDateTime
}

// DiagnosticResultReady is the payload of TypeDiagnosticResultReady: an agent or a workflow step produced a diagnostic report (source agent or workflow).
type DiagnosticResultReady struct {
	ReportID   string `json:"reportId"`   // the report
	PatientID  string `json:"patientId"`  // the patient (pat_)
	Code       string `json:"code"`       // what was assessed (e.g. news2, qsofa)
	Conclusion string `json:"conclusion"` // the report's conclusion
	Severity   string `json:"severity"`   // NONE, LOW, MEDIUM, HIGH or CRITICAL
}

// WebhookStatusChanged is the payload of TypeWebhookStatusChanged: a webhook subscription changed status, e.g. paused after 10 consecutive failed deliveries.
type WebhookStatusChanged struct {
	WebhookID    string `json:"webhookId"`        // the subscription (wh_)
	From         string `json:"from"`             // previous status
	To           string `json:"to"`               // new status: active, paused, failing or disabled
	FailureCount int64  `json:"failureCount"`     // consecutive failed deliveries
	Reason       string `json:"reason,omitempty"` // why it changed
}
