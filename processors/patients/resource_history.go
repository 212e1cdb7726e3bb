package patients

// History of the generic store's resources (fhir_resource_versions), for History.

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/access"
)

// typeVersions reads the versions of one type other than Patient for History: a read-only typed
// table's, the generic store's, or both for Encounter (its typed table and the FHIR base's).
func (s *Service) typeVersions(ctx context.Context, p *access.Principal, t string, q HistoryQuery, after *historyCursor) ([]HistoryEntry, error) {
	var list []HistoryEntry
	if r, ok := historyTables[t]; ok {
		typed, err := s.resourceHistory(ctx, p, r, t, q, after)
		if err != nil {
			return nil, err
		}
		list = typed
	}
	if !GenericType(t) {
		return list, nil
	}
	stored, err := s.genericHistory(ctx, p, t, q, after)
	return append(list, stored...), err
}

// genericHistory reads the versions of generic type t, newest first, at most q.Count+1; tenancy
// and test mode are the current row's (a resource keeps its patient's).
func (s *Service) genericHistory(ctx context.Context, p *access.Principal, t string, q HistoryQuery, after *historyCursor) ([]HistoryEntry, error) {
	w := &where{}
	w.add(`v.type = %s`, t)
	w.add(`(%s = '' or r.org_id = %[1]s) and (%s or r.synthetic)`, p.OrgFilter(), p.SeesRealPatients())
	w.conds = append(w.conds, historyFilters(w, q, after, t, "v.last_updated", "v.id", "v.version_id"))
	w.args = append(w.args, q.Count+1)
	rows, _ := s.pool.Query(ctx, `select v.id, v.version_id, v.last_updated, v.deleted, v.resource, coalesce(r.patient_id, '')
from fhir_resource_versions v join fhir_resources r on r.org_id = v.org_id and r.type = v.type and r.id = v.id
where `+strings.Join(w.conds, " and ")+` order by v.last_updated desc, v.id desc, v.version_id desc limit $`+strconv.Itoa(len(w.args)), w.args...)
	var out []HistoryEntry
	var e HistoryEntry
	if _, err := pgx.ForEachRow(rows, []any{&e.ID, &e.Version, &e.Updated, &e.Deleted, &e.Resource, &e.PatientID}, func() error {
		e.Type = t
		if e.Deleted || string(e.Resource) == "null" {
			e.Resource = nil // a deletion has no resource (R4's bdl-5)
		}
		out = append(out, e)
		e = HistoryEntry{}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("%s history: %w", t, err)
	}
	return out, nil
}
