package fhir

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"carehub/ingest/intake"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/kernel/jsonwire"
	"carehub/processors/patients"
)

// create serves POST [type]: a new resource with an id the server assigns, whatever id the body
// carries.
func (h handler) create(w http.ResponseWriter, r *http.Request) {
	t, ok := route(w, r)
	if !ok {
		return
	}
	if !resourceTypes[t] && !generic(t) {
		writeError(w, r, &statusError{status: http.StatusMethodNotAllowed, msg: t + " is read-only here"})
		return
	}
	cond, err := conditionOf(r)
	if err != nil {
		writeErrorAt(w, r, err, t)
		return
	}
	res := h.createOne(r, t, cond, func(limit int64) ([]byte, error) { return readBody(w, r, limit) })
	if res.err != nil {
		writeErrorAt(w, r, res.err, t)
		return
	}
	w.Header().Set("Location", baseURL(r)+"/"+t+"/"+res.id+"/_history/"+res.version)
	setValidators(w, res.doc)
	if minimal(r, t) {
		writeMinimal(w, res.status)
		return
	}
	writeDoc(w, r, res.status, res.doc)
}

// created is the outcome of one create: the resource, its FHIR id and version, and the status
// (201, or 200 when a conditional create matched).
type created struct {
	doc         json.RawMessage
	id, version string
	status      int
	err         error
}

// createOne creates a resource of type t from the body read: a Patient (conditionally, with
// ifNoneExist) or an Observation through intake. What the body says of its id and version is
// dropped first (withoutServerElements).
func (h handler) createOne(r *http.Request, t, ifNoneExist string, read func(int64) ([]byte, error)) created {
	switch t {
	case "Patient":
		body, err := read(resourceBodyLimit)
		if err != nil {
			return created{err: err}
		}
		return h.createPatient(r, withoutServerElements(body), ifNoneExist)
	case "Observation":
		if ifNoneExist != "" {
			return created{err: &statusError{status: http.StatusBadRequest, param: "If-None-Exist",
				msg: "conditional create is not served for Observation (it is stored moments after its 201, so a search would miss it); send an Idempotency-Key to make an Observation's retries idempotent"}}
		}
		if h.Intake == nil {
			return created{err: &statusError{status: http.StatusMethodNotAllowed, msg: "this node does not run observation intake (the ingest role)"}}
		}
		body, err := read(h.Intake.MaxBodyBytes())
		if err != nil {
			return created{err: err}
		}
		return h.createObservation(r, withoutServerElements(body))
	}
	if generic(t) {
		return h.createGeneric(r, t, ifNoneExist, read)
	}
	return created{err: &statusError{status: http.StatusMethodNotAllowed, msg: t + " is read-only here"}}
}

func (h handler) createPatient(r *http.Request, body []byte, ifNoneExist string) created {
	var doc json.RawMessage
	status := http.StatusCreated
	cond, err := parseCondition("Patient", ifNoneExist, "If-None-Exist")
	if err != nil {
		return created{err: err}
	}
	if cond != nil && cond.q != nil { // any other search: run as the search is, then the create
		existing, err := h.match(r, "Patient", cond)
		if err != nil || existing != nil {
			return matched(existing, err)
		}
		cond = nil
	}
	if cond == nil {
		doc, err = h.Patients.CreatePatient(r.Context(), body)
	} else {
		var isNew bool
		if doc, isNew, err = h.Patients.CreatePatientIfNoneExist(r.Context(), body, *cond.ident); err == nil && !isNew {
			status = http.StatusOK
		}
	}
	if f := fault.As(err); f != nil && f.Kind == fault.KindConflict && cond != nil {
		err = &statusError{status: http.StatusPreconditionFailed, msg: f.Message, param: "If-None-Exist"}
	}
	if err != nil {
		return created{err: err}
	}
	id, version := idVersion(doc)
	return created{doc: doc, id: ids.FHIR(id), version: version, status: status}
}

// conditionIdentifier parses If-None-Exist: identifier=[system|]value, the one condition
// supported.
func conditionIdentifier(cond string) (patients.Identifier, error) {
	bad := &statusError{status: http.StatusBadRequest, param: "If-None-Exist",
		msg: "If-None-Exist must be identifier=system|value (the one condition supported), not " + strconv.Quote(cond)}
	q := cond
	if _, rest, ok := strings.Cut(cond, "?"); ok { // [base/]Patient?identifier=…, as HAPI sends it
		q = rest
	}
	v, err := url.ParseQuery(q)
	v.Del("_format")
	if err != nil || len(v) != 1 || len(v["identifier"]) != 1 || v.Get("identifier") == "" || strings.Contains(v.Get("identifier"), ",") {
		return patients.Identifier{}, bad
	}
	return token(v.Get("identifier")), nil
}

// createObservation sends one Observation, without an id of its own, through intake, the path of
// POST /v1/observations: intake gives it a new id, or with an Idempotency-Key the id of the first
// request with that key and body, so that a retry is stored once. 201 means the broker has it: the
// observation writer stores it moments later.
func (h handler) createObservation(r *http.Request, body []byte) created {
	var head struct {
		ResourceType string `json:"resourceType"`
	}
	// Intake also takes Bundles: one posted here would be stored and then refused as not one
	// Observation, and its client would send again what was stored. Malformed JSON is intake's
	// to word.
	if json.Unmarshal(body, &head) == nil && head.ResourceType != "Observation" {
		return created{err: fault.Validation("the body must be an Observation (POST Bundles to "+Base+")",
			map[string]string{"resourceType": "must be Observation"})}
	}
	res, err := h.Intake.Submit(r.Context(), intake.Submission{ContentType: mediaFHIRJSON, Body: bytes.NewReader(body),
		IdempotencyKey: r.Header.Get("Idempotency-Key")})
	if err != nil {
		return created{err: withRetryAfter(err, h.Intake.RetryAfter())}
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(body, &doc); err != nil || doc == nil || len(res.Answer.IDs) != 1 {
		return created{err: fmt.Errorf("create observation: intake accepted %d observations of one", len(res.Answer.IDs))}
	}
	id := res.Answer.IDs[0]
	doc["id"], _ = json.Marshal(id)
	meta := map[string]json.RawMessage{}
	_ = json.Unmarshal(doc["meta"], &meta) // none, or the client's profile and tags
	meta["versionId"] = json.RawMessage(`"1"`)
	meta["lastUpdated"], _ = json.Marshal(time.Now().UTC().Format(time.RFC3339Nano))
	doc["meta"], _ = json.Marshal(meta)
	out, _ := json.Marshal(doc)
	return created{doc: out, id: ids.FHIR(id), version: "1", status: http.StatusCreated}
}

// withoutServerElements drops from a resource body what a create takes from the server, not the
// client (FHIR R4 http.html#create: "If an id is provided, the server SHALL ignore it"): id, and
// meta.versionId and meta.lastUpdated (meta goes when nothing else is left in it). A client id
// deciding what is stored lost data: an id sent twice (HL7's examples, for two patients) was
// answered 201 twice and stored once. The other members keep their order and form; a body that
// is not a JSON object is returned as it is, for the resource's parser to word.
func withoutServerElements(body []byte) []byte {
	if !bytes.HasPrefix(bytes.TrimSpace(body), []byte("{")) || !jsonwire.Valid(body) {
		return body
	}
	out := append(make([]byte, 0, len(body)), '{')
	_ = jsonwire.MemberSpans(body, func(key, v []byte, start, end int) error {
		member := body[start:end]
		switch string(key) {
		case "id":
			return nil
		case "meta":
			if member = metaWithoutVersion(v); member == nil {
				return nil
			}
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, member...)
		return nil
	})
	return append(out, '}')
}

// metaWithoutVersion is the member "meta": v without versionId and lastUpdated, nil when nothing
// is left. A meta that is not an object is kept for the parser to refuse.
func metaWithoutVersion(v []byte) []byte {
	var meta map[string]json.RawMessage
	if json.Unmarshal(v, &meta) == nil && meta != nil {
		delete(meta, "versionId")
		delete(meta, "lastUpdated")
		if len(meta) == 0 {
			return nil
		}
		v, _ = json.Marshal(meta)
	}
	return append([]byte(`"meta":`), v...)
}
