package rest

import (
	"net/http"
	"strconv"
	"time"

	"github.com/gorilla/mux"

	"carehub/api/envelope"
	"carehub/ingest/intake"
	"carehub/processors/patients"
)

// ObservationIngestRoutes mounts POST /v1/observations (write:observations) on r, which must
// run the authentication middleware. It is the ingest role's route.
//
// The body is a FHIR R4 Observation or Bundle (batch or transaction) as application/fhir+json
// or application/json, or FHIR NDJSON as application/fhir+ndjson (also application/x-ndjson),
// at most 16 MiB and 10,000 observations (413 PAYLOAD_TOO_LARGE). The answer comes after the
// broker has acknowledged the accepted observations:
//
//	202 {accepted, rejected: [{index, code, message}], ids}
//	422 VALIDATION_FAILED with details {accepted: 0, rejected, ids: []} when nothing is valid,
//	    or a transaction Bundle has an invalid entry (then nothing is accepted)
//	503 UNAVAILABLE + Retry-After when the writers are too far behind or Kafka is unavailable
//	    (nothing is accepted)
//
// An Idempotency-Key header replays the first answer for 24 h (Idempotent-Replayed: true); the
// same key with another body is 409 CONFLICT. An Observation.id is kept as an identifier
// (urn:carehub:client-id) and makes retries idempotent: the same observation sent again gets the
// same id and is stored once, while another observation under an id already used is stored as
// one of its own, never answered 202 and dropped (intake.ClientObservationID).
func ObservationIngestRoutes(r *mux.Router, in *intake.Intake) {
	r.Handle("/v1/observations", ingestHandler{in}).Methods(http.MethodPost)
}

type ingestHandler struct{ in *intake.Intake }

func (h ingestHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// A request holds a producer and an open Kafka transaction while it streams: bound slow
	// senders by the same timeout as the whole request.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(h.in.RequestTimeout()))
	res, err := h.in.Submit(r.Context(), intake.Submission{
		ContentType:    r.Header.Get("Content-Type"),
		Body:           http.MaxBytesReader(w, r.Body, h.in.MaxBodyBytes()),
		IdempotencyKey: r.Header.Get("Idempotency-Key"),
	})
	if res.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	if err != nil {
		status, obj := envelope.NewErrorObject(r, err)
		if status == http.StatusServiceUnavailable {
			// Backpressure and broker outages are expected states, logged by the intake once;
			// WriteError would log every refused request.
			w.Header().Set("Retry-After", strconv.Itoa(int((h.in.RetryAfter()+time.Second-1)/time.Second)))
			envelope.WriteJSON(w, status, envelope.ErrorBody{Error: obj})
			return
		}
		envelope.WriteError(w, r, err)
		return
	}
	envelope.WriteJSON(w, http.StatusAccepted, res.Answer)
}

// observations serves GET /v1/patients/{id}/observations (mounted by PatientRoutes).
func (h patientHandlers) observations(w http.ResponseWriter, r *http.Request) {
	p := envelope.NewQuery(r)
	q := patients.ObservationListQuery{Code: p.Str("code"), Since: p.Time("since"),
		Limit: p.Int("limit", 100, 1, 1000), Cursor: p.Str("cursor")}
	if err := p.Err(); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	page, err := h.svc.ListObservationDocuments(r.Context(), mux.Vars(r)["id"], q)
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	envelope.WriteJSON(w, http.StatusOK, FHIRList{Data: nonNilRaw(page.Observations), Meta: envelope.CursorMeta{Total: page.Total, Cursor: cursorOrNull(page.NextCursor)}})
}
