package fhir

// GET [base]/Patient/{id}/$everything: a patient's whole record as a searchset Bundle, paged as
// searches are (_count, _offset; next and previous links).

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/gorilla/mux"

	"carehub/api/envelope"
	"carehub/kernel/ids"
)

// everythingParams are the parameters $everything takes; others are refused (400) unless
// Prefer: handling=lenient.
var everythingParams = []string{"_count", "_offset", "_format", "_pretty"}

func (h handler) everything(w http.ResponseWriter, r *http.Request) {
	if _, ok := route(w, r); !ok {
		return
	}
	count, offset, ignored, err := everythingQuery(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	id := ids.FromFHIR(mux.Vars(r)["id"])
	page, err := h.Patients.Everything(r.Context(), id, count, offset)
	if err != nil {
		writeErrorAt(w, r, err, "Patient")
		return
	}
	self := baseURL(r) + "/Patient/" + ids.FHIR(id) + "/$everything"
	b := bundle{ResourceType: "Bundle", Type: "searchset", Total: intPtr(page.Total),
		Link: []link{{Relation: "self", URL: everythingURL(r, self, offset)}}}
	if next := offset + count; count > 0 && int64(next) < page.Total {
		b.Link = append(b.Link, link{Relation: "next", URL: everythingURL(r, self, next)})
	}
	if offset > 0 && count > 0 {
		b.Link = append(b.Link, link{Relation: "previous", URL: everythingURL(r, self, max(offset-count, 0))})
	}
	for _, e := range page.Entries {
		b.Entry = append(b.Entry, entry{FullURL: fullURL(r, e.Type, e.Resource), Resource: e.Resource, Search: &searchMode{Mode: "match"}})
	}
	var warnings []string
	if len(page.Omitted) > 0 {
		warnings = append(warnings, strings.Join(page.Omitted, " and ")+" are left out: they need read:observations")
	}
	if len(ignored) > 0 {
		warnings = append(warnings, "parameters ignored (Prefer: handling=lenient): "+strings.Join(ignored, ", "))
	}
	for _, msg := range warnings {
		oo, _ := json.Marshal(Outcome{ResourceType: "OperationOutcome", Issue: []Issue{{Severity: "warning", Code: "informational", Diagnostics: msg}}})
		b.Entry = append(b.Entry, entry{Resource: oo, Search: &searchMode{Mode: "outcome"}})
	}
	writeResource(w, http.StatusOK, b)
}

// everythingQuery reads _count (0..1000, default 100: a record is large) and _offset.
func everythingQuery(r *http.Request) (count, offset int, ignored []string, err error) {
	count = 100
	lenient := envelope.Prefers(r, "handling", "lenient")
	for name, values := range r.URL.Query() {
		if !slices.Contains(everythingParams, name) {
			if lenient {
				ignored = append(ignored, name)
				continue
			}
			return 0, 0, nil, badParam(name, "unknown parameter of $everything (supported: %s); send Prefer: handling=lenient to ignore it",
				strings.Join(everythingParams, ", "))
		}
		if len(values) > 1 {
			return 0, 0, nil, badParam(name, "may be given once")
		}
		n, convErr := strconv.Atoi(values[0])
		switch name {
		case "_count":
			if convErr != nil || n < 0 || n > maxCount {
				return 0, 0, nil, badParam(name, "must be an integer from 0 to %d", maxCount)
			}
			count = n
		case "_offset":
			if convErr != nil || n < 0 {
				return 0, 0, nil, badParam(name, "must be a non-negative integer (the next link sets it)")
			}
			offset = n
		}
	}
	slices.Sort(ignored)
	return count, offset, ignored, nil
}

func everythingURL(r *http.Request, self string, offset int) string {
	v := r.URL.Query()
	v.Del("_offset")
	if offset > 0 {
		v.Set("_offset", strconv.Itoa(offset))
	}
	if enc := v.Encode(); enc != "" {
		return self + "?" + enc
	}
	return self
}
