package auth

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"carehub/api/envelope"
	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/kernel/fault"
	"carehub/storage"
)

// AuditReader answers audit log reads; *audit.Service (carehub/processors/audit) is the real one.
type AuditReader interface {
	Query(ctx context.Context, q storage.AuditQuery) (storage.AuditPage, error)
	Export(ctx context.Context, q storage.AuditQuery, emit func(r storage.AuditRecord, cursor string) error) error
}

// Handlers serves the REST endpoints of authentication: the token exchange, the JWKS, API key
// management (/v1/api-keys, a carehub extension) and the audit log (/v1/audit).
type Handlers struct {
	tokens *Tokens
	keys   *KeyAdmin
	audit  AuditReader // nil: /v1/audit is not mounted
	orgs   OrgResolver // nil: an orgId is taken as an id
}

// OrgResolver names an organization by its id or its slug, as the caller sees it: one it cannot
// see is a NotFound fault. *orgs.Service (carehub/processors/orgs) is the real one.
type OrgResolver interface {
	OrgID(ctx context.Context, ref string) (string, error)
}

// NewHandlers returns the handlers; audit may be nil.
func NewHandlers(tokens *Tokens, keys *KeyAdmin, audit AuditReader) *Handlers {
	return &Handlers{tokens: tokens, keys: keys, audit: audit}
}

// WithOrgs makes the orgId of POST /v1/api-keys and GET /v1/audit accept a slug, as every other
// place that names an organization does.
func (h *Handlers) WithOrgs(orgs OrgResolver) *Handlers {
	h.orgs = orgs
	return h
}

// orgID resolves ref (an organization's id or slug; empty stays empty) to the organization's id.
func (h *Handlers) orgID(ctx context.Context, ref string) (string, error) {
	if ref == "" || h.orgs == nil {
		return ref, nil
	}
	return h.orgs.OrgID(ctx, ref)
}

// Routes mounts the endpoints that need a credential on r, which must be behind
// Authenticator.Middleware:
//
//	POST   /v1/auth/token
//	GET    /v1/api-keys
//	POST   /v1/api-keys
//	GET    /v1/api-keys/{id}
//	POST   /v1/api-keys/{id}/rotate
//	POST   /v1/api-keys/{id}/revoke
//	DELETE /v1/api-keys/{id}
//	GET    /v1/audit
//	GET    /v1/audit/export
//
// The audit log has no write, edit or delete route: records are written by the audit pipeline
// only and removed only by retention, never before the HIPAA floor.
func (h *Handlers) Routes(r *mux.Router) {
	r.HandleFunc("/v1/auth/token", h.Token).Methods(http.MethodPost)
	r.HandleFunc("/v1/api-keys", h.ListKeys).Methods(http.MethodGet)
	r.HandleFunc("/v1/api-keys", h.CreateKey).Methods(http.MethodPost)
	r.HandleFunc("/v1/api-keys/{id}", h.GetKey).Methods(http.MethodGet)
	r.HandleFunc("/v1/api-keys/{id}/rotate", h.RotateKey).Methods(http.MethodPost)
	r.HandleFunc("/v1/api-keys/{id}/revoke", h.RevokeKey).Methods(http.MethodPost)
	r.HandleFunc("/v1/api-keys/{id}", h.RevokeKey).Methods(http.MethodDelete)
	if h.audit != nil {
		r.HandleFunc("/v1/audit", h.Audit).Methods(http.MethodGet)
		r.HandleFunc("/v1/audit/export", h.AuditExport).Methods(http.MethodGet)
	}
}

// PublicRoutes mounts the endpoints that need no credential: GET /.well-known/jwks.json.
func (h *Handlers) PublicRoutes(r *mux.Router) {
	r.HandleFunc("/.well-known/jwks.json", h.JWKS).Methods(http.MethodGet)
}

// Token is POST /v1/auth/token: body {scope: [..]}, the API key in Authorization.
func (h *Handlers) Token(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Scope json.RawMessage `json:"scope"`
	}
	if err := envelope.DecodeJSON(r, &body); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	var scopes []string
	if len(body.Scope) == 0 || string(body.Scope) == "null" {
		envelope.WriteError(w, r, fault.Validation("invalid token request", map[string]string{"scope": "required: a list of scope names"}))
		return
	}
	if err := json.Unmarshal(body.Scope, &scopes); err != nil {
		envelope.WriteError(w, r, fault.Validation("invalid token request", map[string]string{"scope": "must be a list of scope names, e.g. [\"read:patients\"]"}))
		return
	}
	tok, err := h.tokens.Issue(r.Context(), access.From(r.Context()), scopes)
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Pragma", "no-cache")
	envelope.WriteJSON(w, http.StatusOK, tok)
}

// JWKS is GET /.well-known/jwks.json.
func (h *Handlers) JWKS(w http.ResponseWriter, r *http.Request) {
	set, err := h.tokens.JWKS(r.Context())
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "public, max-age=300")
	envelope.WriteJSON(w, http.StatusOK, set)
}

// ListKeys is GET /v1/api-keys: {data: [key]}, masked.
func (h *Handlers) ListKeys(w http.ResponseWriter, r *http.Request) {
	list, err := h.keys.List(r.Context())
	envelope.Respond(w, r, http.StatusOK, envelope.List[apikeys.Key]{Data: list}, err)
}

// GetKey is GET /v1/api-keys/{id}.
func (h *Handlers) GetKey(w http.ResponseWriter, r *http.Request) {
	k, err := h.keys.Get(r.Context(), mux.Vars(r)["id"])
	envelope.Respond(w, r, http.StatusOK, k, err)
}

// CreateKey is POST /v1/api-keys: body {name, mode, scopes, ipAllowlist, orgId (id or slug;
// platform operator only)}; 201 with the key's secret under "key", shown this once.
func (h *Handlers) CreateKey(w http.ResponseWriter, r *http.Request) {
	var body struct {
		OrgID       string   `json:"orgId"`
		Name        string   `json:"name"`
		Mode        string   `json:"mode"`
		Scopes      []string `json:"scopes"`
		IPAllowlist []string `json:"ipAllowlist"`
	}
	if err := envelope.DecodeJSON(r, &body); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	orgID, err := h.orgID(r.Context(), body.OrgID)
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	ck, err := h.keys.Create(r.Context(), apikeys.NewKey{OrgID: orgID, Name: body.Name, Mode: body.Mode,
		Scopes: body.Scopes, IPAllowlist: body.IPAllowlist})
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	envelope.WriteJSON(w, http.StatusCreated, ck)
}

// RotateKey is POST /v1/api-keys/{id}/rotate: 201 with the replacement and its secret; the old
// key keeps working for 24 hours.
func (h *Handlers) RotateKey(w http.ResponseWriter, r *http.Request) {
	ck, err := h.keys.Rotate(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	envelope.WriteJSON(w, http.StatusCreated, ck)
}

// RevokeKey is POST /v1/api-keys/{id}/revoke and DELETE /v1/api-keys/{id}: 200 with the
// revoked key. Revoking a revoked key is not an error.
func (h *Handlers) RevokeKey(w http.ResponseWriter, r *http.Request) {
	k, err := h.keys.Revoke(r.Context(), mux.Vars(r)["id"])
	envelope.Respond(w, r, http.StatusOK, k, err)
}

// Audit is GET /v1/audit: query from, to (RFC 3339; from inclusive, to exclusive), keyId,
// patientId, operation (exact), limit (1..1000, default 100), cursor, and orgId (id or slug;
// platform operator only). 200 {data: [record], meta: {total, cursor}}, newest first.
func (h *Handlers) Audit(w http.ResponseWriter, r *http.Request) {
	q := envelope.NewQuery(r)
	aq, rangeErr := auditQuery(q)
	aq.Limit = q.Int("limit", 0, 1, 1000)
	if err := h.checkAuditQuery(r.Context(), q, &aq, rangeErr); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	page, err := h.audit.Query(r.Context(), aq)
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	for i := range page.Records {
		page.Records[i].ResourceIDs = nonNil(page.Records[i].ResourceIDs)
		page.Records[i].PatientIDs = nonNil(page.Records[i].PatientIDs)
	}
	if page.Records == nil {
		page.Records = []storage.AuditRecord{}
	}
	var cursor *string
	if page.NextCursor != "" {
		cursor = &page.NextCursor
	}
	envelope.WriteJSON(w, http.StatusOK, envelope.List[storage.AuditRecord]{Data: page.Records,
		Meta: envelope.CursorMeta{Total: page.Total, Cursor: cursor}})
}

// auditQuery reads the filters GET /v1/audit and its export share: the compliance questions
// (who touched patient X, everything key K did, in a time range).
func auditQuery(q *envelope.Query) (storage.AuditQuery, error) {
	from, err := q.From()
	return storage.AuditQuery{OrgID: q.Str("orgId"), KeyID: q.Str("keyId"), PatientID: q.Str("patientId"),
		Operation: q.Str("operation"), Cursor: q.Str("cursor"), From: from, To: q.Time("to")}, err
}

// checkAuditQuery refuses a malformed audit query and resolves its orgId (an id or a slug).
func (h *Handlers) checkAuditQuery(ctx context.Context, q *envelope.Query, aq *storage.AuditQuery, rangeErr error) error {
	if err := q.Err(); err != nil {
		return err
	}
	if rangeErr != nil {
		return rangeErr
	}
	var err error
	if aq.OrgID, err = h.orgID(ctx, aq.OrgID); err != nil {
		return err
	}
	if !aq.From.IsZero() && aq.To.Before(aq.From) && !aq.To.IsZero() {
		return fault.Validation("to must not be before from", map[string]string{"to": "must not be before from"})
	}
	return nil
}

// ExportedAuditRecord is one line of an NDJSON audit export: the record and the cursor that
// resumes the export after it.
type ExportedAuditRecord struct {
	storage.AuditRecord
	Cursor string `json:"cursor"`
}

var auditColumns = []string{"id", "time", "orgId", "keyId", "mode", "clientIp", "userAgent", "operation",
	"resourceIds", "patientIds", "outcome", "status", "latencyMs", "truncated", "authFailure", "credential", "cursor"}

// AuditExport is GET /v1/audit/export: every record GET /v1/audit pages through (same filters),
// newest first, streamed as NDJSON or CSV (gzip on request), each with its resume cursor.
// Requires admin:org, like the list; the export is itself audited.
func (h *Handlers) AuditExport(w http.ResponseWriter, r *http.Request) {
	q := envelope.NewQuery(r)
	aq, rangeErr := auditQuery(q)
	format, compress := envelope.ExportOptions(q, r)
	if err := h.checkAuditQuery(r.Context(), q, &aq, rangeErr); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	var out *envelope.Export
	start := func() { out = envelope.StartExport(w, "audit", format, compress, auditColumns) }
	err := h.audit.Export(r.Context(), aq, func(rec storage.AuditRecord, cursor string) error {
		if out == nil {
			start()
		}
		rec.ResourceIDs, rec.PatientIDs = nonNil(rec.ResourceIDs), nonNil(rec.PatientIDs)
		return out.Write(ExportedAuditRecord{AuditRecord: rec, Cursor: cursor}, []string{rec.ID, rec.Time.Format(time.RFC3339Nano),
			rec.OrgID, rec.KeyID, rec.Mode, rec.ClientIP, rec.UserAgent, rec.Operation, strings.Join(rec.ResourceIDs, " "),
			strings.Join(rec.PatientIDs, " "), rec.Outcome, strconv.Itoa(rec.Status), strconv.Itoa(rec.LatencyMs),
			strconv.FormatBool(rec.Truncated), rec.AuthFailure, rec.Credential, cursor})
	})
	if out == nil {
		if err != nil {
			envelope.WriteError(w, r, err)
			return
		}
		start()
	}
	out.Close(err)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
