package fhir

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	jsonv1 "github.com/go-json-experiment/json/v1"

	"carehub/api/envelope"
	"carehub/ingest/intake"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/kernel/jsonwire"
	"carehub/processors/patients"
)

type entryRequest struct {
	Method      string `json:"method"`
	URL         string `json:"url"`
	IfNoneExist string `json:"ifNoneExist,omitempty"`
	IfMatch     string `json:"ifMatch,omitempty"` // PUT and DELETE Patient entries of a batch (bundle_versioned.go)
}

type entryResponse struct {
	Status       string          `json:"status"`
	Location     string          `json:"location,omitempty"`
	Etag         string          `json:"etag,omitempty"`
	LastModified string          `json:"lastModified,omitempty"`
	Outcome      json.RawMessage `json:"outcome,omitempty"`
}

// inEntry is one entry of a posted Bundle.
type inEntry struct {
	FullURL  string          `json:"fullUrl"`
	Resource json.RawMessage `json:"resource"`
	Request  *entryRequest   `json:"request"`
}

// bundle serves POST /fhir/R4: a batch (each entry on its own, a batch-response) or a
// transaction (all or nothing, a transaction-response; bundle_tx.go). Entries are POST [type]
// (with ifNoneExist) of every type served, each a create whatever id its resource carries. It is
// served at the base with and without a trailing slash: FHIR clients (fhirpy, fhirclient,
// fhir-kit-client) post to Base + "/".
func (h handler) bundle(w http.ResponseWriter, r *http.Request) {
	if _, ok := route(w, r); !ok {
		return
	}
	limit := int64(resourceBodyLimit)
	if h.Intake != nil {
		limit = h.Intake.MaxBodyBytes()
	}
	body, err := readBody(w, r, limit)
	if err != nil {
		writeErrorAt(w, r, err, "Bundle")
		return
	}
	var in struct {
		ResourceType string    `json:"resourceType"`
		Type         string    `json:"type"`
		Entry        []inEntry `json:"entry"`
	}
	// jsonv1 decodes as encoding/json does, in one pass over the body instead of two: a third of
	// the time on a Synthea patient's Bundle.
	if err := jsonv1.Unmarshal(body, &in); err != nil {
		writeErrorAt(w, r, fault.Validation("the body must be a FHIR Bundle", map[string]string{"": strings.TrimPrefix(err.Error(), "json: ")}), "Bundle")
		return
	}
	if in.ResourceType != "Bundle" {
		writeErrorAt(w, r, fault.Validation("POST to the base takes a Bundle", map[string]string{"resourceType": "must be Bundle"}), "Bundle")
		return
	}
	if in.Type != "batch" && in.Type != "transaction" {
		writeErrorAt(w, r, fault.Validation("Bundle.type must be batch or transaction", map[string]string{"type": "must be batch or transaction"}), "Bundle")
		return
	}
	var out []entry
	if in.Type == "transaction" {
		out, err = h.transaction(r, in.Entry)
	} else {
		out, err = h.batch(r, in.Entry)
	}
	if err != nil {
		writeErrorAt(w, r, err, "")
		return
	}
	writeResource(w, http.StatusOK, bundle{ResourceType: "Bundle", Type: in.Type + "-response",
		Timestamp: time.Now().UTC().Format(time.RFC3339Nano), Entry: out})
}

// plan is a Bundle sorted by what it writes.
type plan struct {
	entries  []inEntry
	patients []int          // indexes of POST Patient entries
	obs      []int          // indexes of POST Observation entries
	generic  []int          // indexes of entries for the generic store
	bad      map[int]error  // entries refused before any write
	refs     map[string]int // fullUrl → index of a Patient entry
}

func (h handler) process(r *http.Request, entries []inEntry, transaction bool) ([]entry, error) {
	p := plan{entries: entries, bad: map[int]error{}, refs: map[string]int{}}
	for i, e := range entries {
		t, err := entryTarget(e)
		if err != nil {
			p.bad[i] = err
			continue
		}
		// Every entry is a create: the server assigns its id and version.
		entries[i].Resource = withoutServerElements(e.Resource)
		switch {
		case t == "Patient":
			p.patients = append(p.patients, i)
			if e.FullURL != "" {
				p.refs[e.FullURL] = i
			}
		case t != "Observation":
			p.generic = append(p.generic, i)
		case h.Intake == nil:
			p.bad[i] = &statusError{status: http.StatusMethodNotAllowed, msg: "this node does not run observation intake (the ingest role)"}
		default:
			p.obs = append(p.obs, i)
		}
	}
	if transaction {
		// Check the observations now, so that a bad one refuses the transaction before the
		// patients are written.
		for _, i := range p.obs {
			raw, _ := h.resolve(r, &p, i)
			if e := h.Intake.Check(raw); e != nil {
				p.bad[i] = entryFault(*e)
			}
		}
		if len(p.bad) > 0 {
			return nil, transactionRefused(p.bad)
		}
	}
	out := make([]entry, len(entries))
	for i, err := range p.bad {
		out[i] = errorEntry(r, err, "")
	}

	// Patients: one Postgres transaction (all of a batch's valid ones, or all of a transaction's).
	var created []string
	patientIDs := map[int]string{}
	if len(p.patients) > 0 {
		list := make([]patients.NewPatient, len(p.patients))
		for k, i := range p.patients {
			list[k].Body = entries[i].Resource
			if c := entries[i].Request.IfNoneExist; c != "" {
				ident, err := conditionIdentifier(c)
				if err != nil {
					p.bad[i] = err
					continue
				}
				list[k].IfNoneExist = &ident
			}
		}
		if transaction && len(p.bad) > 0 {
			return nil, transactionRefused(p.bad)
		}
		res, err := h.Patients.CreatePatients(r.Context(), list)
		if bad, ok := patients.InvalidEntries(err); ok {
			for k, e := range bad {
				p.bad[p.patients[k]] = e
			}
			if transaction {
				return nil, transactionRefused(p.bad)
			}
			res, err = h.createEach(r, list, p.patients, p.bad)
		}
		if err != nil {
			return nil, err
		}
		for k, i := range p.patients {
			if p.bad[i] != nil {
				out[i] = errorEntry(r, p.bad[i], "Patient")
				continue
			}
			id, version := idVersion(res[k].Doc)
			patientIDs[i] = id
			status := "201 Created"
			if !res[k].Created {
				status = "200 OK"
			} else {
				created = append(created, id)
			}
			out[i] = entry{FullURL: fullURL(r, "Patient", res[k].Doc), Resource: res[k].Doc, Response: &entryResponse{Status: status,
				Location: "Patient/" + ids.FHIR(id) + "/_history/" + version, Etag: `W/"` + version + `"`}}
			if minimal(r, "Patient") {
				out[i].Resource = nil
			}
		}
	}

	// Resources of the generic store: each on its own, as a batch's entries are.
	for _, i := range p.generic {
		out[i] = h.genericBatchEntry(r, entries[i])
	}

	// Observations: one Kafka transaction through intake, subjects resolved to the patients.
	if len(p.obs) > 0 {
		var docs []json.RawMessage
		var at []int
		for _, i := range p.obs {
			if p.bad[i] != nil {
				continue
			}
			raw, err := h.resolveCreated(&p, i, patientIDs)
			if err != nil {
				out[i] = errorEntry(r, err, "Observation")
				continue
			}
			docs, at = append(docs, raw), append(at, i)
		}
		if len(docs) > 0 {
			kind := "batch"
			if transaction {
				kind = "transaction"
			}
			res, err := h.submit(r, kind, docs)
			if err != nil {
				if transaction && len(created) > 0 {
					if rerr := h.Patients.RemoveCreated(r.Context(), created); rerr != nil {
						envelope.LoggerFrom(r.Context()).Error("transaction: patients not removed after the observations were refused", "err", rerr)
					}
				}
				if transaction || fault.KindOf(err) != fault.KindValidation {
					return nil, err
				}
			}
			rejected := map[int]intake.EntryError{}
			for _, e := range res.Answer.Rejected {
				rejected[e.Index] = e
			}
			if f := fault.As(err); f != nil {
				if list, ok := f.Details["rejected"].([]intake.EntryError); ok {
					for _, e := range list {
						rejected[e.Index] = e
					}
				}
			}
			next := 0
			for k, i := range at {
				if e, ok := rejected[k]; ok {
					out[i] = errorEntry(r, entryFault(e), "Observation")
					continue
				}
				id := ids.FHIR(res.Answer.IDs[next])
				next++
				out[i] = entry{Response: &entryResponse{Status: "201 Created", Location: "Observation/" + id + "/_history/1", Etag: `W/"1"`}}
			}
		}
	}
	return out, nil
}

// createEach creates a batch's patients one by one after the set was refused for some of them.
func (h handler) createEach(r *http.Request, list []patients.NewPatient, at []int, bad map[int]error) ([]patients.CreatedPatient, error) {
	out := make([]patients.CreatedPatient, len(list))
	for k, np := range list {
		if bad[at[k]] != nil {
			continue
		}
		res, err := h.Patients.CreatePatients(r.Context(), []patients.NewPatient{np})
		if entries, ok := patients.InvalidEntries(err); ok {
			bad[at[k]] = entries[0]
			continue
		}
		if err != nil {
			return nil, err
		}
		out[k] = res[0]
	}
	return out, nil
}

// submit sends observations to intake as one Bundle of kind (batch or transaction).
func (h handler) submit(r *http.Request, kind string, docs []json.RawMessage) (intake.Result, error) {
	var buf bytes.Buffer
	buf.WriteString(`{"resourceType":"Bundle","type":"` + kind + `","entry":[`)
	for k, d := range docs {
		if k > 0 {
			buf.WriteByte(',')
		}
		buf.WriteString(`{"resource":`)
		buf.Write(d)
		buf.WriteString(`,"request":{"method":"POST","url":"Observation"}}`)
	}
	buf.WriteString(`]}`)
	res, err := h.Intake.Submit(r.Context(), intake.Submission{ContentType: mediaFHIRJSON, Body: &buf})
	return res, withRetryAfter(err, h.Intake.RetryAfter())
}

// entryTarget is the resource type an entry creates; other requests are refused.
func entryTarget(e inEntry) (string, error) {
	if e.Request == nil {
		return "", fault.Validation("an entry needs a request", map[string]string{"request": "is required: {method: POST, url: [type]}"})
	}
	var rt string
	if !resourceType(e.Resource, &rt) {
		return "", fault.Validation("an entry needs a resource", map[string]string{"resource": "is required: the resource to create"})
	}
	url := strings.TrimPrefix(strings.TrimPrefix(e.Request.URL, Base+"/"), "/")
	if e.Request.Method != http.MethodPost || (url != "Patient" && url != "Observation" && !generic(url)) {
		return "", &statusError{status: http.StatusMethodNotAllowed, param: "request",
			msg: "Bundle entries may be POST [type] of a type served here (Patient, Observation, Encounter, Condition …), not " +
				e.Request.Method + " " + e.Request.URL}
	}
	if rt != url {
		return "", fault.Validation("the resource does not match request.url", map[string]string{"resource.resourceType": "must be " + url})
	}
	return url, nil
}

// resourceType reads the resourceType of an entry's resource, valid JSON as the Bundle's decoding
// left it, into rt, as decoding it into a struct would (a key matched case-insensitively, the
// last one winning, null leaving rt empty), without decoding the rest; false where that decoding
// fails (no resource, not an object, a resourceType that is not a string).
func resourceType(resource json.RawMessage, rt *string) bool {
	v := bytes.TrimSpace(resource)
	switch {
	case len(v) == 0:
		return false
	case jsonwire.IsNull(v):
		return true
	case v[0] != '{':
		return false
	}
	return jsonwire.Members(v, func(key, value []byte) error {
		if jsonwire.Fold(key, resourceTypeKey) == "" {
			return nil
		}
		return jsonwire.String(value, rt)
	}) == nil
}

var resourceTypeKey = []string{"resourceType"}

// resolve returns an Observation entry with its subject, when it names a Patient entry of the
// Bundle (fullUrl), replaced by an existing patient id for checking: intake checks the form, the
// patient is the Bundle's own.
func (h handler) resolve(r *http.Request, p *plan, i int) ([]byte, bool) {
	ref := subjectRef(p.entries[i].Resource)
	if _, ok := p.refs[ref]; !ok {
		return p.entries[i].Resource, false
	}
	raw, _ := withSubject(p.entries[i].Resource, "Patient/pat-00000000000000000000000000")
	return raw, true
}

// resolveCreated returns an Observation entry whose subject names a Patient entry with the id
// that patient got.
func (h handler) resolveCreated(p *plan, i int, created map[int]string) ([]byte, error) {
	ref := subjectRef(p.entries[i].Resource)
	j, ok := p.refs[ref]
	if !ok {
		return p.entries[i].Resource, nil
	}
	id, ok := created[j]
	if !ok {
		return nil, fault.Validation("the subject's Patient entry was not created", map[string]string{"subject.reference": ref + " refers to a refused entry"})
	}
	return withSubject(p.entries[i].Resource, "Patient/"+id)
}

func subjectRef(raw json.RawMessage) string {
	var o struct {
		Subject struct {
			Reference string `json:"reference"`
		} `json:"subject"`
	}
	_ = json.Unmarshal(raw, &o)
	return o.Subject.Reference
}

func withSubject(raw json.RawMessage, ref string) ([]byte, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fault.Invalid("the entry's resource must be a JSON object")
	}
	subject := map[string]json.RawMessage{}
	_ = json.Unmarshal(doc["subject"], &subject)
	subject["reference"], _ = json.Marshal(ref)
	doc["subject"], _ = json.Marshal(subject)
	return json.Marshal(doc)
}

// entryFault is an intake entry error as a validation error naming its element.
func entryFault(e intake.EntryError) error {
	return fault.Validation(e.Message, map[string]string{entryElement(e): e.Message})
}

// transactionRefused is the 422 (or the first entry's own status) of a transaction of which an
// entry is invalid: every invalid entry named by its element.
func transactionRefused(bad map[int]error) error {
	fields := map[string]string{}
	status := http.StatusUnprocessableEntity
	for i, err := range bad {
		prefix := fmt.Sprintf("Bundle.entry[%d]", i)
		if se, ok := err.(*statusError); ok {
			fields[path(prefix, se.param)] = se.msg
			status = min(status, se.status)
			continue
		}
		f := fault.As(err)
		if f == nil {
			fields[prefix] = err.Error()
			continue
		}
		named := false
		if m, ok := f.Details["fields"].(map[string]any); ok {
			for k, v := range m {
				fields[path(prefix+".resource", k)] = fmt.Sprint(v)
				named = true
			}
		}
		if !named {
			fields[prefix+".resource"] = f.Message
		}
	}
	return &transactionError{status: status, fields: fields}
}

// transactionError is a refused transaction: nothing of it was stored.
type transactionError struct {
	status int
	fields map[string]string
}

func (e *transactionError) Error() string {
	return "transaction refused: " + strconv.Itoa(len(e.fields)) + " problem(s); nothing of it was stored"
}

// errorEntry is a batch-response entry for a refused entry.
func errorEntry(r *http.Request, err error, resource string) entry {
	status, oo := outcomeOf(r, err, resource)
	b, _ := json.Marshal(oo)
	return entry{Response: &entryResponse{Status: strconv.Itoa(status) + " " + http.StatusText(status), Outcome: b}}
}
