package rest

import (
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"

	"github.com/gorilla/mux"

	"carehub/api/envelope"
	"carehub/kernel/fault"
	"carehub/processors/patients"
)

// PatientRoutes mounts the FHIR patient routes on r, which must run the authentication
// middleware (the service checks scopes, tenancy and test mode from the request context):
//
//	POST /v1/patients                    create a FHIR Patient (write:patients) → 201 + Location
//	PUT  /v1/patients/{id}               replace one (write:patients) → 200
//	GET  /v1/patients                    list (read:patients): riskLevel, program, limit 1..100 (20), cursor
//	GET  /v1/patients/{id}               one FHIR Patient (read:patients)
//	GET  /v1/patients/{id}/observations  its observations, newest first (read:observations):
//	                                     code, since, limit 1..1000 (100), cursor
//
// Another organization's patient, and a real patient under a test key, are 404 NOT_FOUND.
func PatientRoutes(r *mux.Router, svc *patients.Service) {
	h := patientHandlers{svc: svc}
	r.HandleFunc("/v1/patients", h.create).Methods(http.MethodPost)
	r.HandleFunc("/v1/patients", h.list).Methods(http.MethodGet)
	r.HandleFunc("/v1/patients/{id}", h.get).Methods(http.MethodGet)
	r.HandleFunc("/v1/patients/{id}", h.update).Methods(http.MethodPut)
	r.HandleFunc("/v1/patients/{id}/observations", h.observations).Methods(http.MethodGet)
}

// patientBodyLimit is the REST body limit (DECISIONS §3).
const patientBodyLimit = 1 << 20

type patientHandlers struct{ svc *patients.Service }

// FHIRList is a list of FHIR resources in the REST list envelope {data, meta}.
type FHIRList struct {
	Data []json.RawMessage   `json:"data"`
	Meta envelope.CursorMeta `json:"meta"`
}

func (h patientHandlers) create(w http.ResponseWriter, r *http.Request) {
	body, err := readFHIRBody(w, r)
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	doc, err := h.svc.CreatePatient(r.Context(), body)
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	var created struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(doc, &created)
	w.Header().Set("Location", "/v1/patients/"+created.ID)
	envelope.WriteJSON(w, http.StatusCreated, doc)
}

func (h patientHandlers) update(w http.ResponseWriter, r *http.Request) {
	body, err := readFHIRBody(w, r)
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	doc, err := h.svc.UpdatePatient(r.Context(), mux.Vars(r)["id"], body)
	envelope.Respond(w, r, http.StatusOK, doc, err)
}

func (h patientHandlers) get(w http.ResponseWriter, r *http.Request) {
	doc, err := h.svc.PatientDocument(r.Context(), mux.Vars(r)["id"])
	envelope.Respond(w, r, http.StatusOK, doc, err)
}

func (h patientHandlers) list(w http.ResponseWriter, r *http.Request) {
	p := envelope.NewQuery(r)
	q := patients.PatientListQuery{RiskLevel: p.Str("riskLevel"), Program: p.Str("program"),
		Limit: p.Int("limit", 20, 1, 100), Cursor: p.Str("cursor")}
	if err := p.Err(); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	page, err := h.svc.ListPatientDocuments(r.Context(), q)
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	envelope.WriteJSON(w, http.StatusOK, FHIRList{Data: nonNilRaw(page.Patients), Meta: envelope.CursorMeta{Total: page.Total, Cursor: cursorOrNull(page.NextCursor)}})
}

// readFHIRBody reads a JSON body of at most patientBodyLimit: application/fhir+json or
// application/json, else 415; over the limit 413; invalid UTF-8 or a NUL character 400. FHIR
// resources are open (extensions, and elements carehub does not model), so unknown fields are
// the FHIR parser's to judge.
func readFHIRBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || (mt != "application/fhir+json" && mt != "application/json") {
		return nil, fault.New(fault.KindUnsupportedMedia, "Content-Type must be application/fhir+json or application/json")
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, patientBodyLimit))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, err
		}
		return nil, fault.Invalid("the request body could not be read")
	}
	if err := envelope.CheckJSONText(b); err != nil {
		return nil, err
	}
	return b, nil
}

func cursorOrNull(c string) *string {
	if c == "" {
		return nil
	}
	return &c
}

func nonNilRaw(l []json.RawMessage) []json.RawMessage {
	if l == nil {
		return []json.RawMessage{}
	}
	return l
}
