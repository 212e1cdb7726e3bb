package patients

// FHIR history (instance, type and system level) behind the FHIR base's _history (api/fhir):
// the versions of patients (patient_versions, tombstones of deleted ones included) and the one
// version of each Observation, Encounter and RiskAssessment, newest first, under the same
// tenancy, test mode and scopes as the reads.

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/access"
	"carehub/kernel/fault"
)

// HistoryEntry is one version of a resource. Resource is nil for a deletion.
type HistoryEntry struct {
	Type      string
	ID        string // carehub id
	Version   int
	Updated   time.Time
	Deleted   bool
	Resource  json.RawMessage
	PatientID string
}

// Method is the interaction that made the version: POST (version 1), PUT, or DELETE.
func (e HistoryEntry) Method() string {
	switch {
	case e.Deleted:
		return "DELETE"
	case e.Version == 1:
		return "POST"
	}
	return "PUT"
}

// HistoryQuery selects versions. Types lists the resource types (Patient, Observation,
// Encounter, RiskAssessment); ID narrows to one resource (instance history, one type).
type HistoryQuery struct {
	Types []string
	ID    string
	Since time.Time // versions made at or after it; zero for all
	Count int       // page size, 1..1000
	After string    // the Cursor of an earlier page
}

// HistoryPage is one page of versions, newest first (ties: type, then id descending, then
// version descending: a total order, so that a page boundary is exact). Cursor continues it, ""
// on the last page. Paging is keyset: versions written while a client pages arrive before its
// first page and never shift the pages it has yet to read.
type HistoryPage struct {
	Entries []HistoryEntry
	Cursor  string
}

// ErrBadHistoryCursor is an After this service did not produce (400).
var ErrBadHistoryCursor = fault.Invalid("invalid history page: follow the Bundle's next link unchanged")

// historyScopes are the scopes reading each type needs, as its read does.
var historyScopes = map[string][]string{
	"Patient":        {access.ReadPatients},
	"Observation":    {access.ReadObservations},
	"Encounter":      {access.ReadPatients},
	"RiskAssessment": {access.ReadPatients, access.ReadObservations},
}

// historyTables are the read-only types' tables (their one version is their creation).
var historyTables = map[string]searchable{"Observation": observationSearch, "Encounter": encounterSearch, "RiskAssessment": riskSearch}

// historyCursor is the position of the last entry of a page.
type historyCursor struct {
	U time.Time `json:"u"`
	T string    `json:"t"`
	I string    `json:"i"`
	V int       `json:"v"`
}

// History returns a page of versions. Requires the read scopes of every type asked for.
func (s *Service) History(ctx context.Context, q HistoryQuery) (HistoryPage, error) {
	var scopes []string
	for _, t := range q.Types {
		sc, ok := historyScopes[t]
		if !ok && !GenericType(t) {
			return HistoryPage{}, fault.NotFound("resource type", t)
		}
		if !ok {
			sc = readScopes(t) // the generic store's types (resource_history.go)
		}
		scopes = append(scopes, sc...)
	}
	p, err := access.Require(ctx, scopes...)
	if err != nil {
		return HistoryPage{}, err
	}
	var after *historyCursor
	if q.After != "" {
		b, err := base64.RawURLEncoding.DecodeString(q.After)
		after = &historyCursor{}
		if err != nil || json.Unmarshal(b, after) != nil || after.T == "" {
			return HistoryPage{}, ErrBadHistoryCursor
		}
	}
	var all []HistoryEntry
	for _, t := range q.Types {
		var list []HistoryEntry
		if t == "Patient" {
			list, err = s.patientHistory(ctx, p, q, after)
		} else {
			list, err = s.typeVersions(ctx, p, t, q, after)
		}
		if err != nil {
			return HistoryPage{}, err
		}
		all = append(all, list...)
	}
	slices.SortFunc(all, func(a, b HistoryEntry) int {
		return cmp.Or(b.Updated.Compare(a.Updated), cmp.Compare(a.Type, b.Type), cmp.Compare(b.ID, a.ID), cmp.Compare(b.Version, a.Version))
	})
	var page HistoryPage
	if len(all) > q.Count {
		all = all[:q.Count]
		last := all[len(all)-1]
		b, _ := json.Marshal(historyCursor{U: last.Updated, T: last.Type, I: last.ID, V: last.Version})
		page.Cursor = base64.RawURLEncoding.EncodeToString(b)
	}
	page.Entries = all
	for _, e := range all {
		if e.Type != "Patient" {
			access.Touch(ctx, touchKind(e.Type), e.ID)
		}
		access.Touch(ctx, access.KindPatient, e.PatientID)
	}
	return page, nil
}

func touchKind(t string) string {
	switch t {
	case "Observation":
		return access.KindObservation
	case "Encounter":
		return access.KindEncounter
	}
	return "" // RiskAssessments are recorded by their patient, as their search does
}

// historyKeyset is the condition that a row of type t (columns updated, id, version) comes after c in
// the history's order; "true" on the first page.
func historyKeyset(w *where, c *historyCursor, t, updated, id, version string) string {
	switch {
	case c == nil:
		return "true"
	case t > c.T:
		return w.format(updated+` <= %s`, c.U)
	case t < c.T:
		return w.format(updated+` < %s`, c.U)
	}
	return w.format(`(`+updated+` < %[1]s or (`+updated+` = %[1]s and (`+id+` < %[2]s or (`+id+` = %[2]s and `+version+` < %[3]s))))`, c.U, c.I, c.V)
}

// historyFilters are the conditions of a history query on one table's columns.
func historyFilters(w *where, q HistoryQuery, after *historyCursor, t, updated, id, version string) string {
	conds := []string{historyKeyset(w, after, t, updated, id, version)}
	if q.ID != "" {
		conds = append(conds, w.format(id+` = %s`, q.ID))
	}
	if !q.Since.IsZero() {
		conds = append(conds, w.format(updated+` >= %s`, q.Since))
	}
	return strings.Join(conds, " and ")
}

// patientHistory reads the patient versions of a page: those kept in patient_versions, and for
// a patient written before versions were kept (the demo's, say), its current state.
func (s *Service) patientHistory(ctx context.Context, p *access.Principal, q HistoryQuery, after *historyCursor) ([]HistoryEntry, error) {
	w := &where{args: []any{p.OrgFilter(), p.SeesRealPatients()}} // $1, $2 in both branches
	kept := historyFilters(w, q, after, "Patient", "v.updated_at", "v.patient_id", "v.version_id")
	legacy := historyFilters(w, q, after, "Patient", "p.updated_at", "p.id", "p.version_id")
	w.args = append(w.args, q.Count+1)
	sql := `select v.patient_id, v.version_id, v.updated_at, v.deleted, v.resource from patient_versions v
where ($1 = '' or v.org_id = $1) and ($2 or v.synthetic) and ` + kept + `
union all
select p.id, p.version_id, p.updated_at, false, null from patients p
where ($1 = '' or p.org_id = $1) and ($2 or p.synthetic) and ` + legacy + `
and not exists (select 1 from patient_versions k where k.patient_id = p.id)
order by 3 desc, 1 desc, 2 desc limit $` + strconv.Itoa(len(w.args))
	rows, _ := s.pool.Query(ctx, sql, w.args...)
	var out []HistoryEntry
	var current []string
	var e HistoryEntry
	if _, err := pgx.ForEachRow(rows, []any{&e.ID, &e.Version, &e.Updated, &e.Deleted, &e.Resource}, func() error {
		e.Type, e.PatientID = "Patient", e.ID
		if string(e.Resource) == "null" {
			e.Resource = nil
		}
		if e.Resource == nil && !e.Deleted {
			current = append(current, e.ID)
		}
		out = append(out, e)
		e = HistoryEntry{}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("patient history: %w", err)
	}
	return out, s.renderCurrent(ctx, out, current)
}

// renderCurrent fills in the entries of legacy patients (ids) with their current state.
func (s *Service) renderCurrent(ctx context.Context, list []HistoryEntry, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	rows, _ := s.pool.Query(ctx, `select `+patientDocumentColumns+` from patients where id = any($1)`, ids)
	found, err := pgx.CollectRows(rows, pgx.RowToStructByName[patientRow])
	if err != nil {
		return fmt.Errorf("patient history: %w", err)
	}
	docs := map[string]json.RawMessage{}
	for i := range found {
		if docs[found[i].ID], err = renderPatient(&found[i]); err != nil {
			return err
		}
	}
	for i := range list {
		if list[i].Resource == nil && !list[i].Deleted {
			list[i].Resource = docs[list[i].ID]
		}
	}
	return nil
}

// resourceHistory reads the versions of a read-only type: one per resource, made when it was
// stored.
func (s *Service) resourceHistory(ctx context.Context, p *access.Principal, r searchable, t string, q HistoryQuery, after *historyCursor) ([]HistoryEntry, error) {
	w := &where{}
	w.add(`(%s = '' or pt.org_id = %[1]s) and (%s or pt.synthetic)`, p.OrgFilter(), p.SeesRealPatients())
	w.conds = append(w.conds, historyFilters(w, q, after, t, r.updated, "t.id", "1"))
	w.args = append(w.args, q.Count+1)
	rows, err := s.pool.Query(ctx, `select `+r.columns+` from `+r.from+` where `+strings.Join(w.conds, " and ")+
		` order by `+r.updated+` desc, t.id desc limit $`+strconv.Itoa(len(w.args)), w.args...)
	if err != nil {
		return nil, fmt.Errorf("%s history: %w", t, err)
	}
	defer rows.Close()
	var out []HistoryEntry
	for rows.Next() {
		res, err := r.render(rows)
		if err != nil {
			return nil, fmt.Errorf("%s history: %w", t, err)
		}
		out = append(out, HistoryEntry{Type: t, ID: res.id, Version: 1, Updated: res.updated, Resource: res.doc, PatientID: res.patientID})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s history: %w", t, err)
	}
	return out, nil
}
