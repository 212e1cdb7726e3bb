package rest

import (
	"net/http"
	"time"

	"github.com/gorilla/mux"

	"carehub/api/envelope"
	"carehub/processors/retention"
)

// RetentionRoutes mounts an organization's retention of its event log and audit log:
//
//	GET /v1/organizations/{id}/retention   the policy and the last purge (admin:org)
//	PUT /v1/organizations/{id}/retention   replace the policy (the platform operator)
func RetentionRoutes(authed *mux.Router, svc *retention.Service) {
	h := &retentionHandler{svc}
	authed.HandleFunc("/v1/organizations/{id}/retention", h.get).Methods(http.MethodGet)
	authed.HandleFunc("/v1/organizations/{id}/retention", h.put).Methods(http.MethodPut)
}

type retentionHandler struct{ svc *retention.Service }

// Retention is the answer of both routes. A null number of days keeps that log forever.
type Retention struct {
	OrganizationID     string     `json:"organizationId"`
	EventRetentionDays *int       `json:"eventRetentionDays"`
	AuditRetentionDays *int       `json:"auditRetentionDays"`
	UpdatedAt          *time.Time `json:"updatedAt"`
	LastPurgeAt        *time.Time `json:"lastPurgeAt"`
	EventsPurged       int64      `json:"eventsPurged"` // by the last purge
	AuditPurged        int64      `json:"auditRecordsPurged"`
}

// retentionBody is what PUT takes: the two numbers of days, nothing else; an absent one keeps
// that log forever (strict input refuses null).
type retentionBody struct {
	EventRetentionDays *int `json:"eventRetentionDays"`
	AuditRetentionDays *int `json:"auditRetentionDays"`
}

func (h *retentionHandler) get(w http.ResponseWriter, r *http.Request) {
	p, err := h.svc.Policy(r.Context(), mux.Vars(r)["id"])
	h.write(w, r, p, err)
}

func (h *retentionHandler) put(w http.ResponseWriter, r *http.Request) {
	var body retentionBody
	if err := envelope.DecodeJSON(r, &body); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	p, err := h.svc.SetPolicy(r.Context(), mux.Vars(r)["id"], body.EventRetentionDays, body.AuditRetentionDays)
	h.write(w, r, p, err)
}

func (h *retentionHandler) write(w http.ResponseWriter, r *http.Request, p *retention.Policy, err error) {
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	out := Retention{OrganizationID: p.OrgID, EventRetentionDays: p.EventDays, AuditRetentionDays: p.AuditDays,
		EventsPurged: p.EventsPurged, AuditPurged: p.AuditPurged}
	if !p.UpdatedAt.IsZero() {
		out.UpdatedAt = &p.UpdatedAt
	}
	if !p.PurgedAt.IsZero() {
		out.LastPurgeAt = &p.PurgedAt
	}
	envelope.WriteJSON(w, http.StatusOK, out)
}
