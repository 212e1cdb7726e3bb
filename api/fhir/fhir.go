package fhir

import (
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/gorilla/mux"

	"carehub/ingest/intake"
	"carehub/kernel/fault"
	"carehub/kernel/fhirjson"
	"carehub/kernel/ids"
	"carehub/kernel/jsonwire"
	"carehub/processors/fhirsubs"
	"carehub/processors/patients"
)

// Base is the path of the FHIR base.
const Base = "/fhir/R4"

// mediaFHIRJSON is the media type of every answer.
const mediaFHIRJSON = "application/fhir+json"

// resourceBodyLimit bounds a Patient body as REST's (DECISIONS §3); Observations and Bundles take
// the ingest limit the route's middleware sets.
const resourceBodyLimit = 1 << 20

// Services are what the FHIR base serves from. Intake is nil on a node without the ingest role:
// Observation create, and Bundles holding Observations, are then refused (and the
// CapabilityStatement says so).
type Services struct {
	Patients *patients.Service
	Intake   *intake.Intake
	// Subscriptions serves the Subscriptions backport and Wake its websocket channel; nil: not
	// served (Subscription is then a resource of the generic store, as before).
	Subscriptions *fhirsubs.Service
	Wake          *fhirsubs.Wake
}

type handler struct{ Services }

// Mount mounts the CapabilityStatement on public (no credential) and the rest of the FHIR base
// on authed, which runs the authentication middleware. The router's own refusals under the base
// (no route, another method) are the node router's to answer, with WriteNoRoute.
func Mount(public, authed *mux.Router, s Services) {
	h := handler{s}
	public.HandleFunc(Base+"/metadata", h.metadata).Methods(http.MethodGet)
	authed.HandleFunc(Base, h.bundle).Methods(http.MethodPost)
	authed.HandleFunc(Base+"/", h.bundle).Methods(http.MethodPost) // as FHIR clients post Bundles
	authed.HandleFunc(Base+"/_history", h.systemHistory).Methods(http.MethodGet)
	h.mountBulk(authed)
	h.mountSubscriptions(public, authed)
	authed.HandleFunc(Base+"/{type:[A-Z][A-Za-z]+}", h.search).Methods(http.MethodGet)
	authed.HandleFunc(Base+"/{type:[A-Z][A-Za-z]+}", h.create).Methods(http.MethodPost)
	authed.HandleFunc(Base+"/{type:[A-Z][A-Za-z]+}/_search", h.postSearch).Methods(http.MethodPost)
	authed.HandleFunc(Base+"/{type:[A-Z][A-Za-z]+}/_history", h.typeHistory).Methods(http.MethodGet) // before {id}
	authed.HandleFunc(Base+"/{type:[A-Z][A-Za-z]+}/{id}", h.read).Methods(http.MethodGet)
	authed.HandleFunc(Base+"/{type:[A-Z][A-Za-z]+}/{id}", h.update).Methods(http.MethodPut)
	authed.HandleFunc(Base+"/{type:[A-Z][A-Za-z]+}/{id}", h.remove).Methods(http.MethodDelete)
	authed.HandleFunc(Base+"/{type:[A-Z][A-Za-z]+}/{id}/_history", h.instanceHistory).Methods(http.MethodGet)
	authed.HandleFunc(Base+"/{type:[A-Z][A-Za-z]+}/{id}/_history/{version}", h.vread).Methods(http.MethodGet)
	authed.HandleFunc(Base+"/Patient/{id}/$everything", h.everything).Methods(http.MethodGet)
}

// resourceTypes are the types served, each with whether it is written here.
var resourceTypes = map[string]bool{"Patient": true, "Observation": true, "Encounter": false, "RiskAssessment": false}

// route is the common front of every handler: _format and Accept, and a served resource type.
func route(w http.ResponseWriter, r *http.Request) (string, bool) {
	if err := checkFormat(r); err != nil {
		writeError(w, r, err)
		return "", false
	}
	t := mux.Vars(r)["type"]
	if t != "" && !served(t) {
		writeError(w, r, &statusError{status: http.StatusNotFound, msg: "resource type " + strconv.Quote(t) +
			" is not served here: not a FHIR R4 resource type that is stored (see " + Base + "/metadata)"})
		return "", false
	}
	return t, true
}

// checkFormat refuses a _format or an Accept that asks for something other than FHIR JSON (406).
func checkFormat(r *http.Request) error {
	notJSON := &statusError{status: http.StatusNotAcceptable, msg: "only FHIR JSON is served: _format json or application/fhir+json", param: "_format"}
	if f := r.URL.Query().Get("_format"); f != "" {
		switch f {
		case "json", "application/json", "application/fhir+json", "application/json+fhir":
		default:
			return notJSON
		}
		return nil
	}
	accept := r.Header.Get("Accept")
	if accept == "" {
		return nil
	}
	for _, part := range strings.Split(accept, ",") {
		mt, _, _ := mime.ParseMediaType(strings.TrimSpace(part))
		if mt == "*/*" || mt == "application/*" || strings.Contains(mt, "json") {
			return nil
		}
	}
	return notJSON
}

// readBody reads a FHIR JSON body: application/fhir+json or application/json, else 415.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || (mt != mediaFHIRJSON && mt != "application/json" && mt != "application/json+fhir") {
		return nil, fault.New(fault.KindUnsupportedMedia, "Content-Type must be application/fhir+json")
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, err
		}
		return nil, fault.Invalid("the request body could not be read")
	}
	// Postgres refuses what jsonb cannot hold (an unpaired surrogate escape: 22P05), which
	// answered 500; malformed JSON is left to the resource's parser, which words it.
	if se, ok := errors.AsType[*jsonwire.StorableError](jsonwire.Storable(b)); ok {
		return nil, fault.Invalid("%s", se.Error())
	}
	return b, nil
}

func (h handler) read(w http.ResponseWriter, r *http.Request) {
	t, ok := route(w, r)
	if !ok {
		return
	}
	id := ids.FromFHIR(mux.Vars(r)["id"])
	doc, err := h.Patients.ReadResource(r.Context(), t, id)
	if err != nil {
		writeErrorAt(w, r, h.goneError(r, t, id, err), t)
		return
	}
	if !notModified(w, r, doc) {
		writeDoc(w, r, http.StatusOK, doc)
	}
}

// versions serves vread of the types other than Patient (whose vread is patientVersion, from
// its history, deletions included): the generic store keeps versions; the typed tables'
// resources are never changed once written, so version 1 is their only one.
func (h handler) versions(w http.ResponseWriter, r *http.Request, version int) ([]json.RawMessage, string, bool) {
	t, ok := route(w, r)
	if !ok {
		return nil, "", false
	}
	id := ids.FromFHIR(mux.Vars(r)["id"])
	var list []json.RawMessage
	var err error
	if generic(t) {
		list, err = h.Patients.GenericVersions(r.Context(), t, id, version)
	} else {
		var doc json.RawMessage
		if doc, err = h.Patients.ReadResource(r.Context(), t, id); err == nil && version > 1 {
			err = fault.NotFound(t+" version", ids.FHIR(id)+"/_history/"+strconv.Itoa(version))
		}
		list = []json.RawMessage{doc}
	}
	if err != nil {
		writeErrorAt(w, r, err, t)
		return nil, "", false
	}
	return list, t, true
}

func (h handler) vread(w http.ResponseWriter, r *http.Request) {
	v, err := strconv.Atoi(mux.Vars(r)["version"])
	if err != nil || v < 1 {
		writeError(w, r, fault.NotFound("version", mux.Vars(r)["version"]))
		return
	}
	if mux.Vars(r)["type"] == "Patient" {
		if _, ok := route(w, r); ok {
			h.patientVersion(w, r, ids.FromFHIR(mux.Vars(r)["id"]), v)
		}
		return
	}
	if list, _, ok := h.versions(w, r, v); ok && !notModified(w, r, list[0]) {
		writeDoc(w, r, http.StatusOK, list[0])
	}
}

func (h handler) update(w http.ResponseWriter, r *http.Request) {
	t, ok := route(w, r)
	if !ok {
		return
	}
	if generic(t) {
		h.updateGeneric(w, r, t)
		return
	}
	if t != "Patient" {
		writeError(w, r, &statusError{status: http.StatusMethodNotAllowed, msg: t + " cannot be updated here"})
		return
	}
	body, id, want, ok := readUpdate(w, r, t)
	if !ok {
		return
	}
	body, err := withCarehubID(body, id)
	if err != nil {
		writeErrorAt(w, r, err, t)
		return
	}
	doc, err := h.Patients.UpdatePatientIfMatch(r.Context(), id, body, want)
	if err != nil {
		writeErrorAt(w, r, h.goneError(r, t, id, versionError(t, err)), t)
		return
	}
	if minimal(r, t) {
		_, version := idVersion(doc)
		w.Header().Set("Location", baseURL(r)+"/"+t+"/"+ids.FHIR(id)+"/_history/"+version)
		setValidators(w, doc)
		writeMinimal(w, http.StatusOK)
		return
	}
	writeDoc(w, r, http.StatusOK, doc)
}

// readUpdate reads what every PUT [type]/{id} takes: the body, the id and the version If-Match
// requires (0: none). It answers the error itself; ok is false then.
func readUpdate(w http.ResponseWriter, r *http.Request, t string) (body []byte, id string, want int, ok bool) {
	body, err := readBody(w, r, resourceBodyLimit)
	if err != nil {
		writeErrorAt(w, r, err, t)
		return nil, "", 0, false
	}
	if want, err = ifMatch(r.Header.Get("If-Match")); err != nil {
		writeError(w, r, err)
		return nil, "", 0, false
	}
	return body, ids.FromFHIR(mux.Vars(r)["id"]), want, true
}

// withCarehubID replaces the body's id, in either form, by the carehub id when they name the
// same resource, so that the service's check of the id sees one form.
func withCarehubID(body []byte, id string) ([]byte, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(body, &doc); err != nil || doc == nil {
		return nil, fault.Invalid("the body must be a FHIR resource as a JSON object")
	}
	var bodyID string
	if raw, ok := doc["id"]; ok && json.Unmarshal(raw, &bodyID) == nil && ids.FromFHIR(bodyID) == id {
		doc["id"], _ = json.Marshal(id)
		return json.Marshal(doc)
	}
	return body, nil
}

// idVersion reads id and meta.versionId of a resource.
func idVersion(doc json.RawMessage) (id, version string) {
	if jsonwire.Valid(doc) { // read in place, as decoding the two into a struct would
		_ = jsonwire.Members(doc, func(key, value []byte) error {
			switch jsonwire.Fold(key, idMetaKeys) {
			case "id":
				return jsonwire.String(value, &id)
			case "meta":
				return jsonwire.Members(value, func(key, value []byte) error {
					if jsonwire.Fold(key, versionIDKey) == "" {
						return nil
					}
					return jsonwire.String(value, &version)
				})
			}
			return nil
		})
	}
	if version == "" {
		version = "1"
	}
	return id, version
}

var idMetaKeys, versionIDKey = []string{"id", "meta"}, []string{"versionId"}

// writeDoc writes one resource as FHIR JSON with FHIR ids.
func writeDoc(w http.ResponseWriter, r *http.Request, status int, doc json.RawMessage) {
	if status < 300 {
		setValidators(w, doc)
	}
	writeResource(w, status, doc)
}

// writeResource encodes v (a resource, or a value that marshals to one) with FHIR ids and
// without empty elements.
func writeResource(w http.ResponseWriter, status int, v any) {
	b, err := encodeResource(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"resourceType":"OperationOutcome","issue":[{"severity":"fatal","code":"exception","diagnostics":"encode response"}]}`)
	}
	w.Header().Set("Content-Type", mediaFHIRJSON+"; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// encodeResource encodes v in the FHIR base's JSON form (fhirJSON). A resource encoded already
// (json.RawMessage) and the resources of a Bundle's entries do not go through encoding/json,
// which would check and compact each of them once more: the rewrite checks and tidies them in its
// one pass.
func encodeResource(v any) ([]byte, error) {
	switch x := v.(type) {
	case json.RawMessage:
		if x != nil {
			return fhirJSON(x)
		}
	case bundle:
		return encodeBundle(x)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return fhirJSON(b)
}

// encodeBundle is encodeResource of a Bundle: its entries' resources are copied as they are
// between the members encoding/json writes, in the same order as the structs', then the whole is
// rewritten once.
func encodeBundle(b bundle) ([]byte, error) {
	entries := b.Entry
	b.Entry = nil
	head, err := json.Marshal(b)
	if err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return fhirJSON(head)
	}
	size := len(head) + 16
	for _, e := range entries {
		size += len(e.Resource) + len(e.FullURL) + 128
	}
	out := append(make([]byte, 0, size), head[:len(head)-1]...)
	out = append(out, `,"entry":[`...)
	for i, e := range entries {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, '{')
		if e.FullURL != "" {
			out = jsonwire.AppendString(append(out, `"fullUrl":`...), e.FullURL)
		}
		if len(e.Resource) > 0 {
			if e.FullURL != "" {
				out = append(out, ',')
			}
			out = append(append(out, `"resource":`...), e.Resource...)
		}
		e.FullURL, e.Resource = "", nil
		rest, err := json.Marshal(e)
		if err != nil {
			return nil, err
		}
		if len(rest) > 2 { // {"search":…,"request":…,"response":…}
			if out[len(out)-1] != '{' {
				out = append(out, ',')
			}
			out = append(out, rest[1:len(rest)-1]...)
		}
		out = append(out, '}')
	}
	return fhirJSON(append(out, "]}"...))
}

// fhirJSON rewrites a resource for the FHIR base (fhirjson.Rewrite).
func fhirJSON(b []byte) ([]byte, error) {
	return fhirjson.Rewrite(b)
}

// baseURL is the absolute URL of the FHIR base as the client reached it.
func baseURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host + Base
}

// fullURL is a resource's Bundle.entry.fullUrl.
func fullURL(r *http.Request, t string, doc json.RawMessage) string {
	id, _ := idVersion(doc)
	return baseURL(r) + "/" + t + "/" + ids.FHIR(id)
}

func intPtr(n int64) *int64 { return &n }
