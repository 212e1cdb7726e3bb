package fhir

// Search as FHIR clients use it (issue 52, docs/FHIR.md "Search parameters"): _summary,
// _elements, _total, _revinclude, _has, chained parameters, :missing, :exact, quantity
// search, keyset paging (_page), and conditional create by any search (If-None-Exist, a POST's
// query string, a Bundle entry's request.ifNoneExist).

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/processors/patients"
)

// chain is a chained parameter on a resource's patient (patient.identifier=…,
// subject:Patient.family=…): resolved to the patients it matches by a Patient search under the
// caller's own tenancy, test mode and scopes.
type chain struct {
	name, param, value string
}

// chainParams are the Patient parameters a chain may end in.
var chainParams = []string{"_id", "identifier", "family", "name", "gender"}

// summaryElements are the elements _summary=true keeps besides resourceType, id and meta: the
// summary elements of R4's definitions for the typed types, and for the generic store those of
// the common elements every clinical type shares (docs/FHIR.md).
var summaryElements = map[string][]string{
	"Patient": {"identifier", "active", "name", "telecom", "gender", "birthDate", "deceasedBoolean", "deceasedDateTime", "address",
		"managingOrganization", "link"},
	"Observation": {"identifier", "basedOn", "partOf", "status", "category", "code", "subject", "focus", "encounter",
		"effectiveDateTime", "effectivePeriod", "effectiveInstant", "issued", "performer", "valueQuantity", "valueCodeableConcept",
		"valueString", "valueBoolean", "valueInteger", "valueRange", "valueRatio", "valueSampledData", "valueTime", "valueDateTime",
		"valuePeriod", "hasMember", "derivedFrom"},
	"RiskAssessment": {"identifier", "basedOn", "parent", "status", "method", "code", "subject", "encounter", "occurrenceDateTime",
		"occurrencePeriod", "condition", "performer"},
}

var genericSummary = []string{"identifier", "active", "status", "clinicalStatus", "verificationStatus", "intent", "category",
	"class", "type", "code", "name", "subject", "patient", "beneficiary", "encounter", "effectiveDateTime", "effectivePeriod",
	"occurrenceDateTime", "onsetDateTime", "period", "authoredOn", "recordedDate", "date", "created", "issued"}

// subsetted is the meta.tag FHIR requires on a resource _summary or _elements left incomplete.
var subsetted = map[string]any{"system": "http://terminology.hl7.org/CodeSystem/v3-ObservationValue", "code": "SUBSETTED",
	"display": "Resource encoded in summary mode"}

// subset keeps of doc resourceType, id, meta and the elements named, and tags it SUBSETTED.
func subset(doc json.RawMessage, keep []string) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(doc, &m) != nil {
		return doc
	}
	out := map[string]any{}
	for k, v := range m {
		if k == "resourceType" || k == "id" || slices.Contains(keep, k) {
			out[k] = v
		}
	}
	meta := map[string]any{}
	_ = json.Unmarshal(m["meta"], &meta)
	tags, _ := meta["tag"].([]any)
	meta["tag"] = append(tags, subsetted)
	out["meta"] = meta
	b, err := json.Marshal(out)
	if err != nil {
		return doc
	}
	return b
}

// shape applies _summary=true and _elements to a matched resource of type t.
func (q query) shape(t string, doc json.RawMessage) json.RawMessage {
	switch {
	case q.summary == "true":
		keep, ok := summaryElements[t]
		if !ok {
			keep = genericSummary
		}
		return subset(doc, keep)
	case len(q.elements) > 0:
		return subset(doc, q.elements)
	}
	return doc
}

// special parses the parameters whose name is not a plain parameter of t: _has, chains and
// modifiers. handled false: name is none of them.
func (q *query) special(t, name string, values []string, lenient bool) (bool, error) {
	known := paramsOf(t)
	kindOf := func(n string) string {
		for _, p := range known {
			if p[0] == n {
				return p[1]
			}
		}
		return ""
	}
	one := func() (string, error) {
		if len(values) != 1 || strings.TrimSpace(values[0]) == "" {
			return "", badParam(name, "takes one value")
		}
		return strings.TrimSpace(values[0]), nil
	}
	switch {
	case strings.HasPrefix(name, "_has:"):
		parts := strings.Split(name, ":")
		if t != "Patient" || len(parts) != 4 || (parts[2] != "patient" && parts[2] != "subject") {
			return true, badParam(name, "supported on Patient as _has:[Type]:patient:[param] (or :subject), e.g. _has:Observation:patient:code=…")
		}
		rt, param := parts[1], parts[3]
		ok := rt == "Observation" && (param == "code" || param == "category") ||
			patients.GenericType(rt) && patients.PatientData(rt) && slices.Contains([]string{"code", "category", "status", "identifier"}, param)
		if !ok {
			return true, badParam(name, "supported: _has:Observation:patient:code|category, _has:[clinical type]:patient:code|category|status|identifier")
		}
		for _, raw := range values {
			c := patients.HasClause{Type: rt, Param: param}
			for _, a := range strings.Split(raw, ",") {
				if tok := token(strings.TrimSpace(a)); tok.Value != "" {
					c.Tokens = append(c.Tokens, tok)
				}
			}
			if len(c.Tokens) == 0 {
				return true, badParam(name, "needs a value: [system|]code")
			}
			q.search.Has = append(q.search.Has, c)
		}
		return true, nil
	case strings.Contains(name, "."):
		ref, param, _ := strings.Cut(name, ".")
		base, typ, _ := strings.Cut(ref, ":")
		if kindOf(base) != "reference" || (base != "patient" && base != "subject") || (typ != "" && typ != "Patient") ||
			!slices.Contains(chainParams, param) {
			if lenient {
				q.ignored = append(q.ignored, name)
				return true, nil
			}
			return true, badParam(name, "chains supported on %s: patient.[param] or subject:Patient.[param], param one of %s", t, strings.Join(chainParams, ", "))
		}
		v, err := one()
		if err != nil {
			return true, err
		}
		q.chains = append(q.chains, chain{name: name, param: param, value: v})
		return true, nil
	case strings.Contains(name, ":"):
		base, mod, _ := strings.Cut(name, ":")
		kind := kindOf(base)
		switch {
		case kind == "":
		case mod == "missing" && kind != "string" && patients.MissingSupported(t, base):
			v, err := one()
			if err != nil {
				return true, err
			}
			if v != "true" && v != "false" {
				return true, badParam(name, "must be true or false")
			}
			if q.search.Missing == nil {
				q.search.Missing = map[string]bool{}
			}
			q.search.Missing[base] = v == "true"
			return true, nil
		case mod == "exact" && kind == "string" && (base == "family" || base == "name"):
			for _, raw := range values {
				for _, a := range strings.Split(raw, ",") {
					if a = strings.TrimSpace(a); a != "" {
						if base == "family" {
							q.search.FamiliesExact = append(q.search.FamiliesExact, a)
						} else {
							q.search.NamesExact = append(q.search.NamesExact, a)
						}
					}
				}
			}
			return true, nil
		case mod == "Patient" && kind == "reference" && (base == "patient" || base == "subject"):
			for _, raw := range values {
				if err := q.set(t, base, kind, raw); err != nil {
					return true, err
				}
			}
			return true, nil
		}
		if lenient {
			q.ignored = append(q.ignored, name)
			return true, nil
		}
		if kind == "" {
			return true, badParam(name, "unknown search parameter for %s (supported: %s); send Prefer: handling=lenient to ignore it", t, paramNames(t))
		}
		return true, badParam(name, "modifier :%s is not supported on %s (supported: :missing on token, reference, date and quantity parameters, :exact on family and name)", mod, base)
	}
	return false, nil
}

// setResult parses the result parameters this file adds; false when name is none of them.
func (q *query) setResult(t, name string, alts []string) (bool, error) {
	switch name {
	case "_summary":
		switch alts[0] {
		case "count", "true":
			q.summary = alts[0]
		case "false":
		default:
			return true, badParam(name, "supported: count, true, false")
		}
	case "_elements":
		q.elements = alts
	case "_total", "_totalMethod":
		// _total is FHIR's; _totalMethod (count, estimate, none) is what fhirpy's count() sends.
		switch alts[0] {
		case "none":
			q.search.NoTotal = true
		case "estimate", "accurate", "count":
		default:
			return true, badParam(name, "supported: none, estimate, accurate (_totalMethod: count, estimate, none)")
		}
	case "_revinclude":
		for _, a := range alts {
			rt, param, _ := strings.Cut(a, ":")
			typed := rt == "Observation" || rt == "RiskAssessment"
			if t != "Patient" || (param != "patient" && param != "subject") || !(typed || served(rt) && patients.PatientData(rt) && rt != "Patient") {
				return true, badParam(name, "supported on Patient: [Type]:patient or [Type]:subject of a clinical type (Observation, Encounter, Condition, …)")
			}
			if !slices.Contains(q.revinclude, rt) {
				q.revinclude = append(q.revinclude, rt)
			}
		}
	case "_page":
		after, err := decodeCursor(alts[0])
		if err != nil {
			return true, badParam(name, "is not a position this search gave: follow the next link as given")
		}
		q.search.After = after
	case "value-quantity":
		for _, a := range alts {
			b, err := quantityBound(a)
			if err != nil {
				return true, badParam(name, "%v", err)
			}
			q.search.Quantities = append(q.search.Quantities, b)
		}
	default:
		return false, nil
	}
	return true, nil
}

// quantityBound parses [prefix][number]|[system]|[code] (or [number]||[code], or [number]).
func quantityBound(s string) (patients.QuantityBound, error) {
	b := patients.QuantityBound{Prefix: "eq"}
	parts := strings.Split(s, "|")
	if len(parts) != 1 && len(parts) != 3 {
		return b, errors.New("must be [prefix]number, or [prefix]number|system|code")
	}
	num := parts[0]
	if len(num) > 2 && num[0] >= 'a' && num[0] <= 'z' {
		b.Prefix, num = num[:2], num[2:]
		if !slices.Contains([]string{"eq", "ne", "gt", "lt", "ge", "le", "ap"}, b.Prefix) {
			return b, errors.New("prefix " + strconv.Quote(b.Prefix) + " is not supported (eq, ne, gt, lt, ge, le, ap)")
		}
	}
	if _, err := strconv.ParseFloat(num, 64); err != nil || strings.ContainsAny(num, "xXpP_") || strings.EqualFold(num, "nan") || strings.Contains(strings.ToLower(num), "inf") {
		return b, errors.New(strconv.Quote(num) + " is not a decimal number")
	}
	b.Number = num
	if len(parts) == 3 {
		b.System, b.Code = parts[1], parts[2]
	}
	return b, nil
}

// encodeCursor is the opaque _page value of a position.
func encodeCursor(pos []*string) string {
	b, _ := json.Marshal(pos)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) ([]*string, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, err
	}
	var pos []*string
	if err := json.Unmarshal(b, &pos); err != nil || len(pos) == 0 || len(pos) > 16 {
		return nil, errors.New("malformed")
	}
	return pos, nil
}

// pageLink is the search's URL with _page set to pos (and no _offset): the next page by keyset.
// The parameters ignored under lenient handling are left out: the link then works without the
// Prefer header too.
func pageLink(r *http.Request, t string, pos []*string, ignored []string) string {
	v := r.URL.Query()
	for _, name := range ignored {
		v.Del(name)
	}
	v.Del("_offset")
	v.Set("_page", encodeCursor(pos))
	return baseURL(r) + "/" + t + "?" + v.Encode()
}

// selfLink is the search's URL as asked.
func selfLink(r *http.Request, t string) string {
	u := baseURL(r) + "/" + t
	if enc := r.URL.Query().Encode(); enc != "" {
		u += "?" + enc
	}
	return u
}

// resolveChains turns q's chains into the patients they match: a Patient search with the
// caller's credential, so that a chain sees no patient the caller could not search for (another
// organization's, a real one under a test key).
func (h handler) resolveChains(r *http.Request, q *query) error {
	for _, c := range q.chains {
		ps := patients.Search{Count: maxCount}
		switch c.param {
		case "_id":
			for _, a := range strings.Split(c.value, ",") {
				ps.IDs = append(ps.IDs, ids.FromFHIR(strings.TrimSpace(a)))
			}
		case "identifier":
			for _, a := range strings.Split(c.value, ",") {
				ps.Identifiers = append(ps.Identifiers, token(strings.TrimSpace(a)))
			}
		case "family":
			ps.Families = strings.Split(c.value, ",")
		case "name":
			ps.Names = strings.Split(c.value, ",")
		case "gender":
			ps.Genders = strings.Split(c.value, ",")
		}
		page, err := h.Patients.SearchPatients(r.Context(), ps)
		if err != nil {
			return err
		}
		if page.Next != nil {
			return &statusError{status: http.StatusBadRequest, code: "too-costly", param: c.name,
				msg: c.name + ": matches more than " + strconv.Itoa(maxCount) + " patients; narrow it"}
		}
		found := page.PatientIDs
		if q.search.Patients != nil {
			found = slices.DeleteFunc(slices.Clone(found), func(id string) bool { return !slices.Contains(q.search.Patients, id) })
		}
		if len(found) == 0 {
			found = []string{""} // matches no resource
		}
		q.search.Patients = found
	}
	return nil
}

// revincluded are the resources of the types _revinclude names that refer to the patients of a
// page, as include entries (at most maxCount of each type per page).
func (h handler) revincluded(r *http.Request, q query, patientIDs []string) ([]entry, error) {
	if len(q.revinclude) == 0 || len(patientIDs) == 0 {
		return nil, nil
	}
	var out []entry
	for _, rt := range q.revinclude {
		page, err := h.Patients.SearchType(r.Context(), rt, patients.Search{Patients: patientIDs, Count: maxCount, NoTotal: true})
		if err != nil {
			return nil, err
		}
		for _, doc := range page.Resources {
			typ := rt
			if typ == "Encounter" || !resourceTypes[typ] {
				typ = typeName(doc, rt)
			}
			out = append(out, entry{FullURL: fullURL(r, typ, doc), Resource: doc, Search: &searchMode{Mode: "include"}})
		}
	}
	return out, nil
}

func typeName(doc json.RawMessage, def string) string {
	var head struct {
		ResourceType string `json:"resourceType"`
	}
	if json.Unmarshal(doc, &head) == nil && head.ResourceType != "" {
		return head.ResourceType
	}
	return def
}

// condition is a conditional create: one identifier (matched in the write's own transaction
// under a lock, so that concurrent creates make one resource), or any other search of the type,
// run as the search is (the caller's tenancy, test mode and scopes) before the write.
type condition struct {
	ident *patients.Identifier
	q     *query
	param string
}

// conditionOf is a POST [type]'s conditional create: If-None-Exist, or the search parameters of
// its query string (how fhirpy's get_or_create sends it). Both must then name the same search.
func conditionOf(r *http.Request) (string, error) {
	header := r.Header.Get("If-None-Exist")
	v := r.URL.Query()
	v.Del("_format")
	v.Del("_pretty")
	if len(v) == 0 {
		return header, nil
	}
	if header != "" {
		hv, err := url.ParseQuery(header[strings.Index(header, "?")+1:])
		if err != nil || hv.Encode() != v.Encode() {
			return "", &statusError{status: http.StatusBadRequest, param: "If-None-Exist",
				msg: "If-None-Exist and the query string name different conditions: send one"}
		}
	}
	return v.Encode(), nil
}

// parseCondition reads a conditional create's search of type t; param names it in errors
// (If-None-Exist, request.ifNoneExist). nil for no condition.
func parseCondition(t, cond, param string) (*condition, error) {
	if cond == "" {
		return nil, nil
	}
	raw := cond
	if _, rest, ok := strings.Cut(cond, "?"); ok { // [base/]Patient?identifier=…, as HAPI sends it
		raw = rest
	}
	v, err := url.ParseQuery(raw)
	if err != nil {
		return nil, &statusError{status: http.StatusBadRequest, param: param, msg: param + ": malformed search " + strconv.Quote(cond)}
	}
	v.Del("_format")
	v.Del("_pretty")
	if len(v) == 0 {
		return nil, &statusError{status: http.StatusBadRequest, param: param, msg: param + " must be a search, e.g. identifier=system|value"}
	}
	for name := range v {
		if slices.Contains(resultParams, name) {
			return nil, &statusError{status: http.StatusBadRequest, param: param, msg: param + ": " + name + " shapes a result, it is not a condition"}
		}
	}
	if id := v.Get("identifier"); len(v) == 1 && len(v["identifier"]) == 1 && id != "" && !strings.Contains(id, ",") {
		tok := token(id)
		if tok.Value == "" {
			return nil, &statusError{status: http.StatusBadRequest, param: param, msg: param + ": identifier must be [system|]value"}
		}
		return &condition{ident: &tok, param: param}, nil
	}
	q, err := parseSearch(t, v, false)
	if err != nil {
		msg := err.Error()
		if se, ok := err.(*statusError); ok {
			msg = se.msg
		}
		return nil, &statusError{status: http.StatusBadRequest, param: param, msg: param + ": " + msg}
	}
	q.search.Count, q.search.NoTotal = 2, true
	return &condition{q: &q, param: param}, nil
}

// match runs a condition's search: the one resource it matches (nil for none); two or more are
// 412.
func (h handler) match(r *http.Request, t string, c *condition) (json.RawMessage, error) {
	q := *c.q
	if err := h.resolveChains(r, &q); err != nil {
		return nil, err
	}
	page, err := h.Patients.SearchType(r.Context(), t, q.search)
	if err != nil {
		return nil, err
	}
	switch len(page.Resources) {
	case 0:
		return nil, nil
	case 1:
		return page.Resources[0], nil
	}
	return nil, &statusError{status: http.StatusPreconditionFailed, param: c.param,
		msg: c.param + " matches more than one " + t + ": nothing was created; make the condition select one"}
}

// matched is the answer of a conditional create whose search found doc: 200, nothing written (or
// the search's error).
func matched(doc json.RawMessage, err error) created {
	if err != nil {
		return created{err: err}
	}
	id, version := idVersion(doc)
	return created{doc: doc, id: ids.FHIR(id), version: version, status: http.StatusOK}
}

// retryAfter marks an error of a cause that knows how long a client should wait (observation
// intake behind or its broker down): its 429 and 503 answers carry Retry-After.
type retryAfter struct {
	error
	wait time.Duration
}

func (e retryAfter) Unwrap() error { return e.error }

func withRetryAfter(err error, wait time.Duration) error {
	if err == nil {
		return nil
	}
	return retryAfter{error: err, wait: wait}
}

// setRetryAfter sets Retry-After on a 429 or 503 answer whose cause knows the wait, else, for a
// 503, one second (a transient refusal: the client should come back, not give up).
func setRetryAfter(w http.ResponseWriter, status int, err error) {
	if (status != http.StatusTooManyRequests && status != http.StatusServiceUnavailable) || w.Header().Get("Retry-After") != "" {
		return
	}
	secs := 0
	if ra, ok := errors.AsType[retryAfter](err); ok {
		secs = int((ra.wait + time.Second - 1) / time.Second)
	} else if status == http.StatusServiceUnavailable || fault.KindOf(err) == fault.KindUnavailable {
		secs = 1
	}
	if secs > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(max(secs, 1)))
	}
}

// batchConditions resolves the conditional creates of a batch's entries whose condition is a
// search other than one identifier: an entry that matches is answered in out (200, nothing
// written), one that does not loses its condition and is created. Identifier conditions stay for
// the create's own transaction (atomic under its lock).
func (h handler) batchConditions(r *http.Request, entries []inEntry, at []int, out []entry) ([]inEntry, []int) {
	var rest []inEntry
	var restAt []int
	for k, e := range entries {
		if e.Request == nil || e.Request.IfNoneExist == "" || e.Request.Method != http.MethodPost {
			rest, restAt = append(rest, e), append(restAt, at[k])
			continue
		}
		t, err := entryTarget(e)
		if err != nil || t == "Observation" {
			rest, restAt = append(rest, e), append(restAt, at[k])
			continue
		}
		c, err := parseCondition(t, e.Request.IfNoneExist, "request.ifNoneExist")
		if err == nil && c.ident != nil {
			rest, restAt = append(rest, e), append(restAt, at[k])
			continue
		}
		var doc json.RawMessage
		if err == nil {
			doc, err = h.match(r, t, c)
		}
		switch {
		case err != nil:
			out[at[k]] = errorEntry(r, err, t)
		case doc != nil:
			out[at[k]] = genericEntry(r, t, matched(doc, nil))
		default:
			req := *e.Request
			req.IfNoneExist = ""
			e.Request = &req
			rest, restAt = append(rest, e), append(restAt, at[k])
		}
	}
	return rest, restAt
}

// searchRevIncludes are the _revinclude values type t takes: on Patient, every clinical type's
// resources naming the patients (patient or subject).
func searchRevIncludes(t string) []string {
	if t != "Patient" {
		return nil
	}
	var out []string
	for _, rt := range servedTypes() {
		if rt != "Patient" && patients.PatientData(rt) {
			out = append(out, rt+":patient", rt+":subject")
		}
	}
	return out
}
