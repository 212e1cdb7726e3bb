package fhir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"carehub/api/envelope"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/processors/patients"
)

// Bundle elements.
type bundle struct {
	ResourceType string  `json:"resourceType"`
	Type         string  `json:"type"`
	Timestamp    string  `json:"timestamp,omitempty"`
	Total        *int64  `json:"total,omitempty"`
	Link         []link  `json:"link,omitempty"`
	Entry        []entry `json:"entry,omitempty"`
}

type link struct {
	Relation string `json:"relation"`
	URL      string `json:"url"`
}

type entry struct {
	FullURL  string          `json:"fullUrl,omitempty"`
	Resource json.RawMessage `json:"resource,omitempty"`
	Search   *searchMode     `json:"search,omitempty"`
	Request  *entryRequest   `json:"request,omitempty"`
	Response *entryResponse  `json:"response,omitempty"`
}

type searchMode struct {
	Mode string `json:"mode"`
}

// Search parameters: every resource takes the common ones; each its own (the
// CapabilityStatement lists them from here).
const (
	defaultCount = 20
	maxCount     = 1000
)

// resultParams shape the result, not the match.
var resultParams = []string{"_count", "_sort", "_include", "_format", "_offset", "_page", "_summary", "_elements", "_total",
	"_totalMethod", "_revinclude"}

// searchParams are each type's search parameters and their FHIR types.
var searchParams = map[string][][2]string{
	"Patient": {{"_id", "token"}, {"_lastUpdated", "date"}, {"identifier", "token"}, {"name", "string"}, {"family", "string"},
		{"birthdate", "date"}, {"gender", "token"}},
	"Observation": {{"_id", "token"}, {"_lastUpdated", "date"}, {"patient", "reference"}, {"subject", "reference"},
		{"code", "token"}, {"category", "token"}, {"date", "date"}, {"value-quantity", "quantity"}},
	"Encounter":      {{"_id", "token"}, {"_lastUpdated", "date"}, {"patient", "reference"}, {"subject", "reference"}},
	"RiskAssessment": {{"_id", "token"}, {"_lastUpdated", "date"}, {"patient", "reference"}, {"subject", "reference"}, {"date", "date"}},
}

// sortParams are what _sort takes per type.
var sortParams = map[string][]string{
	"Patient":        {"_id", "_lastUpdated", "family", "given", "birthdate", "gender"},
	"Observation":    {"_id", "_lastUpdated", "date", "value-quantity"},
	"Encounter":      {"_id", "_lastUpdated"},
	"RiskAssessment": {"_id", "_lastUpdated", "date"},
}

// query is a parsed search.
type query struct {
	search  patients.Search
	include bool     // _include of the subject
	ignored []string // unknown parameters under handling=lenient

	revinclude []string // _revinclude: the types whose resources naming the page's patients are included
	chains     []chain  // patient.[param]=…: resolved to patients before the search
	summary    string   // _summary: "count", "true" or ""
	elements   []string // _elements
}

// badParam is a 400 naming the parameter.
func badParam(name, format string, args ...any) error {
	return &statusError{status: http.StatusBadRequest, param: name, msg: name + ": " + fmt.Sprintf(format, args...)}
}

// parseSearch reads the search parameters of type t from v. Unknown parameters (and modifiers)
// are refused, or under lenient handling listed as ignored.
func parseSearch(t string, v url.Values, lenient bool) (query, error) {
	q := query{search: patients.Search{Count: defaultCount}}
	known := paramsOf(t)
	typeOf := func(name string) string {
		for _, p := range known {
			if p[0] == name {
				return p[1]
			}
		}
		return ""
	}
	names := make([]string, 0, len(v))
	for name := range v {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		values := v[name]
		if typeOf(name) == "" && !slices.Contains(resultParams, name) && name != "_pretty" {
			if handled, err := q.special(t, name, values, lenient); err != nil {
				return q, err
			} else if handled {
				continue
			}
		}
		if slices.Contains(resultParams, name) || name == "_pretty" {
			if len(values) > 1 && name != "_revinclude" {
				return q, badParam(name, "may be given once")
			}
		} else if typeOf(name) == "" {
			if lenient {
				q.ignored = append(q.ignored, name)
				continue
			}
			return q, badParam(name, "unknown search parameter for %s (supported: %s); send Prefer: handling=lenient to ignore it", t, paramNames(t))
		} else if typeOf(name) != "date" && typeOf(name) != "quantity" && len(values) > 1 {
			return q, badParam(name, "repeated: give alternatives as one comma-separated value")
		}
		for _, raw := range values {
			if err := q.set(t, name, typeOf(name), raw); err != nil {
				return q, err
			}
		}
	}
	return q, nil
}

func (q *query) set(t, name, kind, raw string) error {
	s := &q.search
	var alts []string
	for _, a := range strings.Split(raw, ",") {
		if a = strings.TrimSpace(a); a != "" {
			alts = append(alts, a)
		}
	}
	if len(alts) == 0 && name != "_format" {
		return badParam(name, "needs a value")
	}
	if ok, err := q.setResult(t, name, alts); ok || err != nil {
		return err
	}
	switch name {
	case "_count":
		n, err := strconv.Atoi(raw)
		if err != nil || n < 0 || n > maxCount {
			return badParam(name, "must be an integer from 0 to %d", maxCount)
		}
		s.Count = n
	case "_offset":
		n, err := strconv.Atoi(raw)
		if err != nil || n < 0 {
			return badParam(name, "must be a non-negative integer (the next link sets it)")
		}
		s.Offset = n
	case "_sort":
		for _, a := range alts {
			k := patients.SortKey{Param: strings.TrimPrefix(a, "-"), Desc: strings.HasPrefix(a, "-")}
			if !slices.Contains(sortsOf(t), k.Param) {
				return badParam(name, "cannot sort %s by %q (supported: %s)", t, k.Param, strings.Join(sortsOf(t), ", "))
			}
			s.Sort = append(s.Sort, k)
		}
	case "_include":
		if t == "Patient" || len(alts) != 1 || (alts[0] != t+":patient" && alts[0] != t+":subject") {
			return badParam(name, "supported: %s:patient or %[1]s:subject (the subject Patient)", t)
		}
		q.include = true
	case "_format", "_pretty":
	case "_id":
		for _, a := range alts {
			s.IDs = append(s.IDs, ids.FromFHIR(a))
		}
	case "encounter":
		for _, a := range alts {
			s.Encounters = append(s.Encounters, ids.FromFHIR(strings.TrimPrefix(a, "Encounter/")))
		}
	case "status":
		for _, a := range alts {
			s.Statuses = append(s.Statuses, token(a))
		}
	case "patient", "subject":
		for _, a := range alts {
			id := strings.TrimPrefix(a, "Patient/")
			if strings.Contains(id, "/") {
				return badParam(name, "must be a Patient id or Patient/<id>")
			}
			s.Patients = append(s.Patients, ids.FromFHIR(id))
		}
	case "identifier", "code", "category":
		for _, a := range alts {
			tok := token(a)
			if tok.Value == "" {
				return badParam(name, "must be [system|]code")
			}
			switch name {
			case "identifier":
				s.Identifiers = append(s.Identifiers, tok)
			case "code":
				s.Codes = append(s.Codes, tok)
			default:
				s.Categories = append(s.Categories, tok)
			}
		}
	case "gender":
		s.Genders = append(s.Genders, alts...)
	case "name":
		s.Names = append(s.Names, alts...)
	case "family":
		s.Families = append(s.Families, alts...)
	default:
		if kind != "date" {
			return badParam(name, "is not supported")
		}
		if len(alts) != 1 {
			return badParam(name, "takes one value per parameter (repeat the parameter for a range)")
		}
		b, err := dateBound(alts[0])
		if err != nil {
			return badParam(name, "%v", err)
		}
		switch name {
		case "birthdate":
			s.BirthDate = append(s.BirthDate, b)
		case "date":
			s.Date = append(s.Date, b)
		case "_lastUpdated":
			s.LastUpdated = append(s.LastUpdated, b)
		}
	}
	return nil
}

// token parses [system|]code; "|code" is a code without a system, which carehub matches like
// any system.
func token(s string) patients.Identifier {
	if sys, code, ok := strings.Cut(s, "|"); ok {
		return patients.Identifier{System: sys, Value: code}
	}
	return patients.Identifier{Value: s}
}

// dateBound parses a FHIR date search value: an optional prefix (eq, ge, gt, le, lt) and a date
// or dateTime of any precision, which spans an interval.
func dateBound(s string) (patients.DateBound, error) {
	b := patients.DateBound{Prefix: "eq"}
	if len(s) > 2 && s[0] >= 'a' && s[0] <= 'z' {
		b.Prefix, s = s[:2], s[2:]
		if !slices.Contains([]string{"eq", "ge", "gt", "le", "lt"}, b.Prefix) {
			return b, fmt.Errorf("prefix %q is not supported (eq, ge, gt, le, lt)", b.Prefix)
		}
	}
	layouts := []struct {
		layout string
		span   func(time.Time) time.Time
	}{
		{"2006", func(t time.Time) time.Time { return t.AddDate(1, 0, 0) }},
		{"2006-01", func(t time.Time) time.Time { return t.AddDate(0, 1, 0) }},
		{time.DateOnly, func(t time.Time) time.Time { return t.AddDate(0, 0, 1) }},
		{"2006-01-02T15:04Z07:00", func(t time.Time) time.Time { return t.Add(time.Minute) }},
		{time.RFC3339, func(t time.Time) time.Time { return t.Add(time.Second) }},
		{time.RFC3339Nano, func(t time.Time) time.Time { return t.Add(time.Nanosecond) }},
	}
	for _, l := range layouts {
		if t, err := time.Parse(l.layout, s); err == nil {
			b.From, b.To = t, l.span(t)
			return b, nil
		}
	}
	return b, fmt.Errorf("%q is not a FHIR date or dateTime (YYYY, YYYY-MM, YYYY-MM-DD, or with a time and zone)", s)
}

func paramNames(t string) string {
	var n []string
	for _, p := range paramsOf(t) {
		n = append(n, p[0])
	}
	return strings.Join(append(n, resultParams...), ", ")
}

func (h handler) search(w http.ResponseWriter, r *http.Request) {
	t, ok := route(w, r)
	if !ok {
		return
	}
	q, err := parseSearch(t, r.URL.Query(), envelope.Prefers(r, "handling", "lenient"))
	if err == nil {
		err = h.resolveChains(r, &q)
	}
	if err != nil {
		writeError(w, r, err)
		return
	}
	if q.summary == "count" {
		q.search.Count = 0
	}
	if q.search.After != nil {
		q.search.Offset = 0
	}
	page, err := h.Patients.SearchType(r.Context(), t, q.search)
	if err != nil {
		writeErrorAt(w, r, err, t)
		return
	}
	b := bundle{ResourceType: "Bundle", Type: "searchset", Link: []link{{Relation: "self", URL: selfLink(r, t)}}}
	if page.Total >= 0 {
		b.Total = intPtr(page.Total)
	}
	// The next page starts after this page's last row (keyset): rows written meanwhile neither
	// shift it nor repeat or skip a row. An old _offset link is still served, its next link by
	// keyset; a keyset page has no previous link.
	if page.Next != nil && q.search.Count > 0 {
		b.Link = append(b.Link, link{Relation: "next", URL: pageLink(r, t, page.Next, q.ignored)})
	}
	if q.search.After == nil && q.search.Offset > 0 && q.search.Count > 0 {
		b.Link = append(b.Link, link{Relation: "previous", URL: pageURL(r, t, max(q.search.Offset-q.search.Count, 0))})
	}
	for _, doc := range page.Resources {
		b.Entry = append(b.Entry, entry{FullURL: fullURL(r, typeName(doc, t), doc), Resource: q.shape(t, doc), Search: &searchMode{Mode: "match"}})
	}
	if q.include && len(page.PatientIDs) > 0 {
		subjects := slices.Compact(slices.Sorted(slices.Values(page.PatientIDs)))
		pts, err := h.Patients.SearchPatients(r.Context(), patients.Search{IDs: subjects, Count: len(subjects)})
		if err != nil {
			writeErrorAt(w, r, err, t)
			return
		}
		for _, doc := range pts.Resources {
			b.Entry = append(b.Entry, entry{FullURL: fullURL(r, "Patient", doc), Resource: doc, Search: &searchMode{Mode: "include"}})
		}
	}
	if t == "Patient" {
		more, err := h.revincluded(r, q, page.PatientIDs)
		if err != nil {
			writeErrorAt(w, r, err, t)
			return
		}
		b.Entry = append(b.Entry, more...)
	}
	if len(q.ignored) > 0 {
		oo, _ := json.Marshal(Outcome{ResourceType: "OperationOutcome", Issue: []Issue{{Severity: "warning", Code: "not-supported",
			Diagnostics: "search parameters ignored (Prefer: handling=lenient): " + strings.Join(q.ignored, ", "), Expression: q.ignored}}})
		b.Entry = append(b.Entry, entry{Resource: oo, Search: &searchMode{Mode: "outcome"}})
	}
	writeResource(w, http.StatusOK, b)
}

// postSearch serves POST [type]/_search: the parameters of a form-encoded body, with those of the
// query string, searched as GET [type]?… is. The Bundle's links are GET URLs carrying them all.
func (h handler) postSearch(w http.ResponseWriter, r *http.Request) {
	if err := formIntoQuery(w, r); err != nil {
		writeError(w, r, err)
		return
	}
	h.search(w, r)
}

// formIntoQuery adds the parameters of a POST _search body to r's query string, checked as the
// router checks every query string (envelope.CheckRequest). An empty body adds nothing.
func formIntoQuery(w http.ResponseWriter, r *http.Request) error {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, resourceBodyLimit))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return err
		}
		return fault.Invalid("the request body could not be read")
	}
	if len(b) == 0 {
		return nil
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/x-www-form-urlencoded" {
		return fault.New(fault.KindUnsupportedMedia, "POST _search takes its parameters as application/x-www-form-urlencoded")
	}
	form, err := url.ParseQuery(string(b))
	if err != nil {
		return fault.Invalid("the form body is malformed: name=value pairs, percent-encoded, separated by &")
	}
	q := r.URL.Query()
	for name, values := range form {
		q[name] = append(q[name], values...)
	}
	r.URL.RawQuery = q.Encode()
	return envelope.CheckRequest(r)
}

// pageURL is the search's URL at offset: the request's parameters with _offset set (the
// ignored ones dropped by nothing: a client sees what it sent).
func pageURL(r *http.Request, t string, offset int) string {
	v := r.URL.Query()
	v.Del("_offset")
	if offset > 0 {
		v.Set("_offset", strconv.Itoa(offset))
	}
	u := baseURL(r) + "/" + t
	if enc := v.Encode(); enc != "" {
		u += "?" + enc
	}
	return u
}
