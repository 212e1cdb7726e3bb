package rest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"carehub/processors/fault"
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
	Data []json.RawMessage `json:"data"`
	Meta CursorMeta        `json:"meta"`
}

func (h patientHandlers) create(w http.ResponseWriter, r *http.Request) {
	body, err := readFHIRBody(w, r)
	if err != nil {
		WriteError(w, r, err)
		return
	}
	doc, err := h.svc.CreatePatient(r.Context(), body)
	if err != nil {
		WriteError(w, r, err)
		return
	}
	var created struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(doc, &created)
	w.Header().Set("Location", "/v1/patients/"+created.ID)
	WriteJSON(w, http.StatusCreated, doc)
}

func (h patientHandlers) update(w http.ResponseWriter, r *http.Request) {
	body, err := readFHIRBody(w, r)
	if err != nil {
		WriteError(w, r, err)
		return
	}
	doc, err := h.svc.UpdatePatient(r.Context(), mux.Vars(r)["id"], body)
	if err != nil {
		WriteError(w, r, err)
		return
	}
	WriteJSON(w, http.StatusOK, doc)
}

func (h patientHandlers) get(w http.ResponseWriter, r *http.Request) {
	doc, err := h.svc.PatientDocument(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		WriteError(w, r, err)
		return
	}
	WriteJSON(w, http.StatusOK, doc)
}

func (h patientHandlers) list(w http.ResponseWriter, r *http.Request) {
	p := fhirParams{r: r}
	q := patients.PatientListQuery{RiskLevel: p.str("riskLevel"), Program: p.str("program"),
		Limit: p.intIn("limit", 20, 1, 100), Cursor: p.str("cursor")}
	if err := p.err(); err != nil {
		WriteError(w, r, err)
		return
	}
	page, err := h.svc.ListPatientDocuments(r.Context(), q)
	if err != nil {
		WriteError(w, r, err)
		return
	}
	WriteJSON(w, http.StatusOK, FHIRList{Data: nonNilRaw(page.Patients), Meta: CursorMeta{Total: page.Total, Cursor: cursorOrNull(page.NextCursor)}})
}

// readFHIRBody reads a JSON body of at most patientBodyLimit: application/fhir+json or
// application/json, else 415; over the limit 413.
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
	return b, nil
}

// fhirParams reads query parameters, collecting every problem for one 400 answer.
type fhirParams struct {
	r   *http.Request
	bad []string
}

func (p *fhirParams) str(name string) string { return strings.TrimSpace(p.r.URL.Query().Get(name)) }

func (p *fhirParams) intIn(name string, def, lo, hi int) int {
	s := p.str(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		p.bad = append(p.bad, fmt.Sprintf("%s must be an integer from %d to %d", name, lo, hi))
		return def
	}
	return n
}

func (p *fhirParams) timestamp(name string) time.Time {
	s := p.str(name)
	if s == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		p.bad = append(p.bad, name+" must be an RFC 3339 timestamp such as 2026-11-01T08:00:00Z")
		return time.Time{}
	}
	return t
}

func (p *fhirParams) err() error {
	if len(p.bad) == 0 {
		return nil
	}
	return fault.Invalid("invalid query parameters: %s", strings.Join(p.bad, "; "))
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
