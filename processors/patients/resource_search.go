package patients

// Search of the generic store and Patient/$everything.

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/access"
	"carehub/kernel/fault"
)

// SearchResources searches resources of a generic type t: IDs, Patients, Encounters, Codes,
// Categories, Identifiers, Statuses, Date, LastUpdated (each matched against the values
// extracted on write, see resource_extract.go); sort by _id, _lastUpdated, date (default _id, which
// is creation order for carehub's ids). Requires read:patients for patient data.
func (s *Service) SearchResources(ctx context.Context, t string, q Search) (SearchPage, error) {
	p, err := access.Require(ctx, readScopes(t)...)
	if err != nil {
		return SearchPage{}, err
	}
	w := &where{}
	w.add(`t.type = %s`, t)
	return s.searchGeneric(ctx, p, genericFrom(t), w, q)
}

func (s *Service) searchGeneric(ctx context.Context, p *access.Principal, from string, w *where, q Search) (SearchPage, error) {
	w.add(`(%s = '' or t.org_id = %[1]s) and (%s or t.synthetic) and not t.deleted`, p.OrgFilter(), p.SeesRealPatients())
	if len(q.IDs) > 0 {
		w.add(`t.id = any(%s)`, q.IDs)
	}
	if len(q.Patients) > 0 {
		w.add(`t.patient_id = any(%s)`, q.Patients)
	}
	if len(q.Encounters) > 0 {
		refs := make([]string, len(q.Encounters))
		for i, e := range q.Encounters {
			refs[i] = "Encounter/" + e
		}
		w.add(`t.refs && %s`, refs)
	}
	for col, list := range map[string][]Identifier{"codes": q.Codes, "categories": q.Categories, "identifiers": q.Identifiers, "status": q.Statuses} {
		if len(list) > 0 {
			toks := make([]string, len(list))
			for i, tok := range list {
				toks[i] = TokenValue(tok)
			}
			w.add(`t.`+col+` && %s`, toks)
		}
	}
	w.spans(q.Date)
	w.dates(q.LastUpdated, `t.last_updated`)
	if err := w.missing(q.Missing, genericMissing); err != nil {
		return SearchPage{}, err
	}
	cols, err := genericOrder(q.Sort)
	if err != nil {
		return SearchPage{}, err
	}
	return s.runSearch(ctx, from, `t.type, t.id, t.resource, coalesce(t.patient_id, '')`, cols, w, q, func(row pgx.CollectableRow) (rendered, error) {
		var res rendered
		var doc []byte // as the store holds it: jsonb, valid JSON
		err := row.Scan(&res.typ, &res.id, &doc, &res.patientID)
		res.doc = doc
		return res, err
	}, func(res rendered) { touch(ctx, res.typ, res.id, res.patientID) })
}

// spans adds each date condition on the interval [date_from, date_to) a resource's date covers
// (an open end unbounded): eq, the interval lies within the value's; ge, gt, le, lt, some of it
// lies after or before the value's (FHIR's range semantics).
func (w *where) spans(bounds []DateBound) {
	const from, to = `coalesce(t.date_from, '-infinity')`, `coalesce(t.date_to, 'infinity')`
	if len(bounds) > 0 {
		w.conds = append(w.conds, `(t.date_from is not null or t.date_to is not null)`)
	}
	for _, b := range bounds {
		switch b.Prefix {
		case "ge":
			w.add(to+` > %s`, b.From)
		case "gt":
			w.add(to+` > %s`, b.To)
		case "le":
			w.add(from+` < %s`, b.To)
		case "lt":
			w.add(from+` < %s`, b.From)
		default: // eq
			w.add(from+` >= %s and `+to+` <= %s`, b.From, b.To)
		}
	}
}

// genericOrder is the ORDER BY of sort keys over the generic store; ties break by type and id.
func genericOrder(keys []SortKey) ([]sortCol, error) {
	cols := map[string]sortCol{"_id": {expr: "t.id", typ: "text", notNull: true}, "_lastUpdated": {expr: "t.last_updated", typ: "timestamptz", notNull: true},
		"date": {expr: "t.date_from", typ: "timestamptz"}, "status": {expr: "t.status[1]", typ: "text"}, "code": {expr: "t.codes[1]", typ: "text"}}
	var out []sortCol
	for _, k := range keys {
		col, ok := cols[k.Param]
		if !ok {
			return nil, fault.Validation("unsupported _sort", map[string]string{"_sort": fmt.Sprintf("cannot sort by %q", k.Param)})
		}
		col.desc = k.Desc
		out = append(out, col)
	}
	return tieBreak(out, sortCol{expr: "t.type", typ: "text", notNull: true}, sortCol{expr: "t.id", typ: "text", notNull: true}), nil
}

// EverythingPart is one resource type's share of a patient's record.
type EverythingPart struct {
	Type     string
	Resource json.RawMessage
}

// EverythingPage is one page of Patient/$everything: the patient first, then the generic
// store's resources of the patient (Encounters, Conditions, …, by type and id), then its
// Observations (newest first) and RiskAssessments. Omitted names what the caller's scopes leave
// out (Observations and RiskAssessments need read:observations too).
type EverythingPage struct {
	Entries []EverythingPart
	Total   int64
	Omitted []string
}

// Everything returns one page (offset, count) of everything of patient id: the patient and every
// resource that belongs to it. Requires read:patients; NotFound when the caller may not see the
// patient.
func (s *Service) Everything(ctx context.Context, id string, count, offset int) (EverythingPage, error) {
	p, err := access.Require(ctx, access.ReadPatients)
	if err != nil {
		return EverythingPage{}, err
	}
	patient, err := s.ReadResource(ctx, "Patient", id)
	if err != nil {
		return EverythingPage{}, err
	}
	var out EverythingPage
	type source struct {
		t      string
		search func(Search) (SearchPage, error)
	}
	sources := []source{{"", func(q Search) (SearchPage, error) {
		w := &where{}
		return s.searchGeneric(ctx, p, genericFrom(""), w, q)
	}}}
	if p.Has(access.ReadObservations) {
		sources = append(sources, source{"Observation", func(q Search) (SearchPage, error) { return s.SearchObservations(ctx, q) }},
			source{"RiskAssessment", func(q Search) (SearchPage, error) { return s.SearchRiskAssessments(ctx, q) }})
	} else {
		out.Omitted = []string{"Observation", "RiskAssessment"}
	}
	out.Total = 1
	if offset == 0 && count > 0 {
		out.Entries = append(out.Entries, EverythingPart{Type: "Patient", Resource: patient})
	}
	// Each source in turn: its total, and the part of the page that falls in it.
	at := int64(1)
	for _, src := range sources {
		q := Search{Patients: []string{id}}
		from := max(int64(offset)-at, 0)
		want := int64(count) - int64(len(out.Entries))
		if want > 0 {
			q.Count, q.Offset = int(want), int(from)
		}
		page, err := src.search(q)
		if err != nil {
			return EverythingPage{}, err
		}
		for _, doc := range page.Resources {
			out.Entries = append(out.Entries, EverythingPart{Type: typeOf(doc, src.t), Resource: doc})
		}
		at += page.Total
		out.Total += page.Total
	}
	return out, nil
}

func typeOf(doc json.RawMessage, t string) string {
	if t != "" {
		return t
	}
	var head struct {
		ResourceType string `json:"resourceType"`
	}
	_ = json.Unmarshal(doc, &head)
	return head.ResourceType
}
