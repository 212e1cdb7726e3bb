package fhir

// History (FHIR R4 http.html#history) at instance, type and system level, as Bundles of type
// history: every entry has fullUrl, request (method and url of the interaction that made the
// version) and response (status, etag, lastModified), and a resource unless the version is a
// deletion. Newest first; _since, _count and keyset paging through next links (_page), so that
// versions written while a client pages never repeat or skip an entry.

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/gorilla/mux"

	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/processors/patients"
)

// historyTypes are the types of the system history, in the order of the CapabilityStatement.
var historyTypes = []string{"Patient", "Observation", "Encounter", "RiskAssessment"}

// historyParams are the parameters a history takes; others are refused (400), as search does.
var historyParams = []string{"_count", "_since", "_page", "_format"}

// systemHistory serves GET [base]/_history: every type's versions the caller may read, which
// needs the read scopes of every type (read:patients and read:observations).
func (h handler) systemHistory(w http.ResponseWriter, r *http.Request) {
	if _, ok := route(w, r); !ok {
		return
	}
	h.serveHistory(w, r, "", patients.HistoryQuery{Types: historyTypes})
}

// typeHistory serves GET [type]/_history.
func (h handler) typeHistory(w http.ResponseWriter, r *http.Request) {
	t, ok := route(w, r)
	if !ok {
		return
	}
	h.serveHistory(w, r, t, patients.HistoryQuery{Types: []string{t}})
}

// instanceHistory serves GET [type]/{id}/_history: one resource's versions, a deleted Patient's
// included (its last version is the deletion). A resource the caller may not see is 404.
func (h handler) instanceHistory(w http.ResponseWriter, r *http.Request) {
	t, ok := route(w, r)
	if !ok {
		return
	}
	id := ids.FromFHIR(mux.Vars(r)["id"])
	h.serveHistory(w, r, t, patients.HistoryQuery{Types: []string{t}, ID: id})
}

func (h handler) serveHistory(w http.ResponseWriter, r *http.Request, t string, q patients.HistoryQuery) {
	if err := historyQuery(r.URL.Query(), &q); err != nil {
		writeError(w, r, err)
		return
	}
	page, err := h.Patients.History(r.Context(), q)
	if err == nil && q.ID != "" && len(page.Entries) == 0 && q.After == "" && q.Since.IsZero() {
		err = fault.NotFound(t, ids.FHIR(q.ID))
	}
	if err != nil {
		writeErrorAt(w, r, err, t)
		return
	}
	b := bundle{ResourceType: "Bundle", Type: "history", Timestamp: time.Now().UTC().Format(time.RFC3339Nano),
		Link: []link{{Relation: "self", URL: historyURL(r, "")}}}
	if page.Cursor != "" {
		b.Link = append(b.Link, link{Relation: "next", URL: historyURL(r, page.Cursor)})
	}
	if q.ID != "" && q.After == "" && q.Since.IsZero() {
		b.Total = intPtr(int64(len(page.Entries)))
		if page.Cursor != "" {
			b.Total = nil // more than one page: the total is not counted
		}
	}
	for _, e := range page.Entries {
		b.Entry = append(b.Entry, historyEntry(r, e))
	}
	writeResource(w, http.StatusOK, b)
}

// historyQuery reads _count (1..1000, default 20), _since and _page into q.
func historyQuery(v url.Values, q *patients.HistoryQuery) error {
	for name := range v {
		if !slices.Contains(historyParams, name) {
			return badParam(name, "not a history parameter: history takes _count, _since and _page (from its next link)")
		}
	}
	q.Count = 20
	if c := v.Get("_count"); c != "" {
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 || n > 1000 {
			return badParam("_count", "must be 1..1000, not %q", c)
		}
		q.Count = n
	}
	if s := v.Get("_since"); s != "" {
		t, err := parseInstant(s)
		if err != nil {
			return badParam("_since", "must be an instant (2024-05-01T10:00:00Z) or a date, not %q", s)
		}
		q.Since = t
	}
	q.After = v.Get("_page")
	return nil
}

// parseInstant reads a FHIR instant, dateTime or date (the start of it, UTC).
func parseInstant(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", time.DateOnly, "2006-01", "2006"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fault.Invalid("not an instant")
}

// historyURL is the history's URL with _page set (self: the request as made).
func historyURL(r *http.Request, page string) string {
	v := r.URL.Query()
	if page != "" {
		v.Set("_page", page)
	}
	u := baseURL(r) + r.URL.Path[len(Base):]
	if enc := v.Encode(); enc != "" {
		u += "?" + enc
	}
	return u
}

// historyEntry is one version as a history Bundle entry: the interaction that made it and what
// it answered.
func historyEntry(r *http.Request, e patients.HistoryEntry) entry {
	id := ids.FHIR(e.ID)
	req := &entryRequest{Method: e.Method(), URL: e.Type + "/" + id}
	res := &entryResponse{Etag: etag(strconv.Itoa(e.Version)), LastModified: e.Updated.UTC().Format(time.RFC3339Nano)}
	switch e.Method() {
	case http.MethodPost:
		req.URL = e.Type
		res.Status = "201 Created"
		res.Location = e.Type + "/" + id + "/_history/" + strconv.Itoa(e.Version)
	case http.MethodPut:
		res.Status = "200 OK"
		res.Location = e.Type + "/" + id + "/_history/" + strconv.Itoa(e.Version)
	default:
		res.Status = "204 No Content"
	}
	return entry{FullURL: baseURL(r) + "/" + e.Type + "/" + id, Resource: e.Resource, Request: req, Response: res}
}

// patientVersion serves a Patient's vread from its history, so that the earlier versions of a
// deleted patient are still read, and its deletion is 410.
func (h handler) patientVersion(w http.ResponseWriter, r *http.Request, id string, version int) {
	page, err := h.Patients.History(r.Context(), patients.HistoryQuery{Types: []string{"Patient"}, ID: id, Count: 1000})
	if err != nil {
		writeErrorAt(w, r, err, "Patient")
		return
	}
	for _, e := range page.Entries {
		if e.Version != version {
			continue
		}
		if e.Deleted {
			writeError(w, r, &statusError{status: http.StatusGone, code: "deleted",
				msg: "version " + strconv.Itoa(version) + " of Patient/" + ids.FHIR(id) + " is its deletion"})
			return
		}
		if !notModified(w, r, e.Resource) {
			writeDoc(w, r, http.StatusOK, e.Resource)
		}
		return
	}
	writeErrorAt(w, r, fault.NotFound("Patient version", ids.FHIR(id)+"/_history/"+strconv.Itoa(version)), "Patient")
}
