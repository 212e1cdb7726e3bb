package patients

// The generic FHIR resource store (fhir_resources, schemas/postgres/0028): every R4 type beyond
// the typed Patient, Observation and RiskAssessment, read, versioned, written and searched under
// the same tenancy, test mode, scopes and audit as patients.
//
// Access: reading patient data (PatientData) needs read:patients, a directory resource any
// credential of the organization; every write needs write:patients. A test key sees only
// synthetic rows: a patient's data is synthetic when its patient is, a directory resource when a
// test key wrote it. Every reference a written resource holds must name a resource the writer can
// see (a test key's cannot name a real patient): that check is what keeps a resource from
// being attached to another tenant's or a real patient through a test key.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/kernel/jsonwire"
)

// KindResource is the audit kind of a generic resource (recorded as Type/id).
const KindResource = "fhir_resource"

// readScopes are the scopes reading resources of type t needs.
func readScopes(t string) []string {
	if PatientData(t) {
		return []string{access.ReadPatients}
	}
	return nil
}

// resourceDoc is a decoded resource body being written.
type resourceDoc map[string]any

// parseResource decodes a resource body of type t for a write: a JSON object whose resourceType
// is t, with a Meta object if any. What the server sets (id, meta.versionId, meta.lastUpdated) is
// dropped. Numbers keep their text (json.Number), so a decimal is stored as sent.
func parseResource(t string, body []byte) (resourceDoc, error) {
	v, err := jsonwire.Tree(body)
	doc, _ := v.(map[string]any)
	if err != nil || doc == nil {
		return nil, fault.Invalid("the body must be a FHIR %s as one JSON object", t)
	}
	bad := map[string]string{}
	if rt, _ := doc["resourceType"].(string); rt != t {
		bad["resourceType"] = "must be " + t
	}
	if m, ok := doc["meta"]; ok {
		meta, isObj := m.(map[string]any)
		if !isObj {
			bad["meta"] = "must be a Meta object"
		} else {
			delete(meta, "versionId")
			delete(meta, "lastUpdated")
			if len(meta) == 0 {
				delete(doc, "meta")
			}
		}
	}
	walkRefs(doc, func(ref string) string {
		if ref == "" {
			bad["reference"] = "a reference must not be empty"
		}
		return ref
	})
	if len(bad) > 0 {
		return nil, fault.Validation("invalid FHIR "+t, bad)
	}
	delete(doc, "id")
	return doc, nil
}

// render sets what the server owns on doc and encodes it.
func (d resourceDoc) render(t, id string, version int, updated time.Time) (json.RawMessage, error) {
	d["resourceType"], d["id"] = t, id
	meta, _ := d["meta"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["versionId"], meta["lastUpdated"] = strconv.Itoa(version), updated.UTC().Format(time.RFC3339Nano)
	d["meta"] = meta
	b, err := d.encode()
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", t, err)
	}
	return b, nil
}

// encode is json.Marshal of d, without reflection (jsonwire.AppendTree).
func (d resourceDoc) encode() ([]byte, error) {
	return jsonwire.AppendTree(nil, map[string]any(d))
}

// testTagged reports whether doc carries the HTEST meta tag (test health data).
func (d resourceDoc) testTagged() bool {
	meta, _ := d["meta"].(map[string]any)
	tagged := false
	eachObject(meta["tag"], func(o map[string]any) {
		if o["system"] == testDataSystem && o["code"] == testDataCode {
			tagged = true
		}
	})
	return tagged
}

// writer is who writes: the organization and whether it sees real patients.
type writer struct {
	p     *access.Principal
	orgID string
}

func requireWriter(ctx context.Context) (writer, error) {
	p, err := access.Require(ctx, access.WritePatients)
	if err != nil {
		return writer{}, err
	}
	if p.OrgID == "" {
		return writer{}, fault.Invalid("the platform operator does not write clinical records: use a key of the organization")
	}
	return writer{p: p, orgID: p.OrgID}, nil
}

// ReadGeneric returns the current version of resource t/id; NotFound when the caller may not see it.
func (s *Service) ReadGeneric(ctx context.Context, t, id string) (json.RawMessage, error) {
	list, err := s.GenericVersions(ctx, t, id, -1)
	if err != nil {
		return nil, err
	}
	return list[0], nil
}

// GenericVersions returns the versions of t/id, newest first: all (version 0), one (vread), or
// the current one only (-1). NotFound when the caller may not see the resource or the version.
func (s *Service) GenericVersions(ctx context.Context, t, id string, version int) ([]json.RawMessage, error) {
	p, err := access.Require(ctx, readScopes(t)...)
	if err != nil {
		return nil, err
	}
	var patientID string
	var current json.RawMessage
	err = s.pool.QueryRow(ctx, `select coalesce(patient_id, ''), resource from `+genericFrom(t)+`
where type = $3 and id = $4 and ($1 = '' or org_id = $1) and ($2 or synthetic) and not deleted limit 1`,
		p.OrgFilter(), p.SeesRealPatients(), t, id).Scan(&patientID, &current)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound(t, ids.FHIR(id))
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", t, err)
	}
	touch(ctx, t, id, patientID)
	if version < 0 {
		return []json.RawMessage{current}, nil
	}
	rows, _ := s.pool.Query(ctx, `select resource from fhir_resource_versions v where type = $1 and id = $2
and ($3 = '' or org_id = $3) and ($4 = 0 or version_id = $4) order by version_id desc`, t, id, p.OrgFilter(), version)
	list, err := pgx.CollectRows(rows, pgx.RowTo[json.RawMessage])
	if err != nil {
		return nil, fmt.Errorf("read %s versions: %w", t, err)
	}
	if len(list) == 0 && version <= 1 { // a typed Encounter: its one version
		list = []json.RawMessage{current}
	}
	if len(list) == 0 {
		return nil, fault.NotFound(t+" version", ids.FHIR(id)+"/_history/"+strconv.Itoa(version))
	}
	return list, nil
}

// genericFrom is the relation a type's rows are read from: Encounters also come from the typed
// table (fhir_typed_encounters).
func genericFrom(t string) string {
	const cols = `org_id, type, id, version_id, synthetic, patient_id, resource, last_updated, deleted, refs, codes,
	categories, identifiers, status, date_from, date_to`
	if t == "Encounter" || t == "" {
		return `(select ` + cols + ` from fhir_resources union all select ` + cols + ` from fhir_typed_encounters) t`
	}
	return `fhir_resources t`
}

// touch records a read of t/id, and of its patient, for the audit record.
func touch(ctx context.Context, t, id, patientID string) {
	if patientID != "" {
		access.Touch(ctx, access.KindPatient, patientID)
	}
	if PatientData(t) {
		access.Touch(ctx, KindResource, t+"/"+id)
	}
}

// CreateResource creates a resource of type t from body with an id carehub assigns (any id in
// the body is ignored). With ifNoneExist it is FHIR's conditional create: when a resource of type
// t the caller may see carries the identifier it is returned with created false and nothing is
// written; two carrying it are a Conflict. References are checked (checkRefs). Requires
// write:patients.
func (s *Service) CreateResource(ctx context.Context, t string, body []byte, ifNoneExist *Identifier) (json.RawMessage, bool, error) {
	w, err := requireWriter(ctx)
	if err != nil {
		return nil, false, err
	}
	doc, err := parseResource(t, body)
	if err != nil {
		return nil, false, err
	}
	var out json.RawMessage
	created := true
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if ifNoneExist != nil {
			existing, err := matchResource(ctx, tx, w, t, *ifNoneExist, true)
			if err != nil || existing != "" {
				created = false
				if err == nil {
					out, err = currentDoc(ctx, tx, w.orgID, t, existing)
				}
				return err
			}
		}
		if err := s.resolveConditional(ctx, tx, w, doc, nil); err != nil {
			return err
		}
		res, err := s.store(ctx, tx, w, t, ids.New(idPrefix(t)), doc, nil, nil)
		out = res
		return err
	})
	if err != nil {
		return nil, false, wrapWrite(t, err)
	}
	return out, created, nil
}

// UpdateResource replaces t/id with body (FHIR update): a new version. A resource that does not
// exist is created under the client's id (update as create; the id must be a FHIR id), as FHIR
// clients that choose their ids expect. The body's id, when given, must be id. With ifMatch
// (FHIR's If-Match; 0 for any version) the resource must exist at that version, checked under
// the row lock the update takes, else *VersionConflict and nothing is written. Returns whether
// it was created. Requires write:patients.
func (s *Service) UpdateResource(ctx context.Context, t, id string, body []byte, ifMatch int) (json.RawMessage, bool, error) {
	w, err := requireWriter(ctx)
	if err != nil {
		return nil, false, err
	}
	if !validID(ids.FHIR(id)) {
		return nil, false, fault.Invalid("%s is not a FHIR id: 1 to 64 of A-Z a-z 0-9 - .", ids.FHIR(id))
	}
	var head struct {
		ID *string `json:"id"`
	}
	if json.Unmarshal(body, &head) == nil && head.ID != nil && ids.FromFHIR(*head.ID) != id {
		return nil, false, fault.Validation("the body's id must be the id in the path", map[string]string{"id": "must be " + ids.FHIR(id)})
	}
	doc, err := parseResource(t, body)
	if err != nil {
		return nil, false, err
	}
	var out json.RawMessage
	var created bool
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if t == "Encounter" {
			var typed bool
			if err := tx.QueryRow(ctx, `select exists(select 1 from encounters where id = $1 and org_id = $2)`, id, w.orgID).Scan(&typed); err != nil {
				return err
			}
			if typed {
				return fault.Conflict("Encounter/%s is written by carehub's integrations and is read-only here", ids.FHIR(id))
			}
		}
		if err := s.resolveConditional(ctx, tx, w, doc, nil); err != nil {
			return err
		}
		res, err := s.store(ctx, tx, w, t, id, doc, nil, &ifMatch)
		out = res
		created = versionOf(res) == 1
		return err
	})
	if err != nil {
		return nil, false, wrapWrite(t, err)
	}
	return out, created, nil
}

func wrapWrite(t string, err error) error {
	if f := fault.As(err); f != nil {
		return f
	}
	if vc, ok := errors.AsType[*VersionConflict](err); ok {
		return vc
	}
	return fmt.Errorf("write %s: %w", t, err)
}

func versionOf(doc json.RawMessage) int {
	var head struct {
		Meta struct {
			VersionID string `json:"versionId"`
		} `json:"meta"`
	}
	_ = json.Unmarshal(doc, &head)
	n, _ := strconv.Atoi(head.Meta.VersionID)
	return n
}

// validID reports whether s is a FHIR id.
func validID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// patientScope is what a written resource inherits from its patient.
type patientScope struct {
	synthetic bool
}

// store writes doc as t/id: a new resource, or with update (the If-Match version, 0 for any) a
// new version of an existing one (created when it does not exist and update is 0). local names the resources of the same transaction that are
// not stored yet (Type/id → their patient's scope): references to them are not looked up.
// Every other reference must name a resource the writer sees.
func (s *Service) store(ctx context.Context, tx pgx.Tx, w writer, t, id string, doc resourceDoc, local map[string]*patientScope, update *int) (json.RawMessage, error) {
	row, err := s.prepareStore(ctx, tx, w, t, id, doc, nil, local, update)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, storeSQL, row.args()...); err != nil {
		return nil, err
	}
	row.touch(ctx)
	return row.out, nil
}

// storedRow is a resource checked and rendered by prepareStore, to be written by storeSQL.
type storedRow struct {
	orgID, t, id string
	version      int
	synthetic    bool
	patientID    *string
	x            extracted
	out          json.RawMessage
	now          time.Time
}

// prepareStore does store's checks and renders the resource, without writing it: a transaction
// sends all of its resources in one batch. x is doc's search values when the caller has them
// (nil: extracted here).
func (s *Service) prepareStore(ctx context.Context, tx pgx.Tx, w writer, t, id string, doc resourceDoc, x *extracted, local map[string]*patientScope, update *int) (*storedRow, error) {
	if x == nil {
		x = new(extract(t, doc))
	}
	if err := refuseEntryRefs(x.entryRefs); err != nil {
		return nil, err
	}
	if err := s.checkRefs(ctx, tx, w, x.refs, local); err != nil {
		return nil, err
	}
	synthetic := !w.p.SeesRealPatients() || doc.testTagged()
	var patientID *string
	if x.patientID != "" && PatientData(t) {
		patientID = &x.patientID
		if sc := local["Patient/"+x.patientID]; sc != nil {
			synthetic = sc.synthetic
		} else if err := tx.QueryRow(ctx, `select synthetic from patients where id = $1`, x.patientID).Scan(&synthetic); err != nil {
			return nil, fmt.Errorf("patient of %s: %w", t, err)
		}
	}
	version := 1
	if update != nil {
		var current int
		var wasSynthetic bool
		err := tx.QueryRow(ctx, `select version_id, synthetic from fhir_resources where org_id = $1 and type = $2 and id = $3 for update`,
			w.orgID, t, id).Scan(&current, &wasSynthetic)
		switch {
		case errors.Is(err, pgx.ErrNoRows) && *update != 0:
			return nil, &VersionConflict{ID: id, Expected: *update}
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return nil, err
		case !wasSynthetic && !w.p.SeesRealPatients():
			return nil, fault.Conflict("%s/%s cannot be written with a test key: choose another id", t, ids.FHIR(id))
		case *update != 0 && *update != current:
			return nil, &VersionConflict{ID: id, Current: current, Expected: *update}
		default:
			version = current + 1
		}
	}
	now := time.Now()
	out, err := doc.render(t, id, version, now)
	if err != nil {
		return nil, err
	}
	return &storedRow{orgID: w.orgID, t: t, id: id, version: version, synthetic: synthetic, patientID: patientID,
		x: *x, out: out, now: now}, nil
}

// storeSQL writes a storedRow (args): the resource and its version, in one statement, so that
// Postgres parses the resource into jsonb once.
const storeSQL = `with current as (
insert into fhir_resources (org_id, type, id, version_id, synthetic, patient_id, resource, last_updated,
	refs, codes, categories, identifiers, status, date_from, date_to)
values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
on conflict (org_id, type, id) do update set version_id = excluded.version_id, synthetic = excluded.synthetic,
	patient_id = excluded.patient_id, resource = excluded.resource, last_updated = excluded.last_updated, deleted = false,
	refs = excluded.refs, codes = excluded.codes, categories = excluded.categories, identifiers = excluded.identifiers,
	status = excluded.status, date_from = excluded.date_from, date_to = excluded.date_to
returning org_id, type, id, version_id, resource, last_updated)
insert into fhir_resource_versions (org_id, type, id, version_id, resource, last_updated) select * from current`

// args are storeSQL's arguments for the row.
func (r *storedRow) args() []any {
	return []any{r.orgID, r.t, r.id, r.version, r.synthetic, r.patientID, r.out, r.now, nonNilStrings(r.x.refs),
		nonNilStrings(r.x.codes), nonNilStrings(r.x.categories), nonNilStrings(r.x.identifiers), nonNilStrings(r.x.status),
		r.x.dateFrom, r.x.dateTo}
}

// touch records the written resource for the audit record, once it is written.
func (r *storedRow) touch(ctx context.Context) {
	touch(ctx, r.t, r.id, r.x.patientID)
}

// refuseEntryRefs refuses references to a Bundle entry (urn:uuid:, urn:oid:; extracted's
// entryRefs) outside a transaction, or ones a transaction could not resolve: stored, they would
// name nothing.
func refuseEntryRefs(found []string) error {
	if len(found) == 0 {
		return nil
	}
	return fault.Validation("a reference names a Bundle entry ("+strings.Join(found, ", ")+"): only a transaction resolves those",
		map[string]string{"reference": "names no stored resource: " + strings.Join(found, ", ")})
}

// checkRefs refuses (422, naming the references) the references among refs that name nothing
// the writer can see: another tenant's resource, a real patient's under a test key, or nothing.
// Those in local (the same transaction's entries, and references already checked, whose scope is
// nil) are not looked up.
func (s *Service) checkRefs(ctx context.Context, q pgx.Tx, w writer, refs []string, local map[string]*patientScope) error {
	var look []string
	for _, r := range refs {
		if _, ok := local[r]; !ok {
			look = append(look, r)
		}
	}
	missing, err := missingRefs(ctx, q, w, look)
	if err != nil || len(missing) == 0 {
		return err
	}
	for i, m := range missing {
		t, id, _ := strings.Cut(m, "/")
		missing[i] = t + "/" + ids.FHIR(id)
	}
	return fault.Validation("a reference names no resource of this organization: "+strings.Join(missing, ", "),
		map[string]string{"reference": "no such resource: " + strings.Join(missing, ", ")})
}

// missingRefs returns those of refs (Type/id) that name nothing the writer can see, in one query.
func missingRefs(ctx context.Context, q pgx.Tx, w writer, refs []string) ([]string, error) {
	if len(refs) == 0 {
		return nil, nil
	}
	rows, _ := q.Query(ctx, `select r from unnest($3::text[]) as r where not (case split_part(r, '/', 1)
when 'Patient' then exists (select 1 from patients where id = split_part(r, '/', 2) and org_id = $1 and ($2 or synthetic))
when 'Observation' then exists (select 1 from observations o join patients pt on pt.id = o.patient_id
	where o.id = split_part(r, '/', 2) and pt.org_id = $1 and ($2 or pt.synthetic))
when 'RiskAssessment' then exists (select 1 from reports o join patients pt on pt.id = o.patient_id
	where o.id = split_part(r, '/', 2) and pt.org_id = $1 and ($2 or pt.synthetic))
when 'Encounter' then exists (select 1 from fhir_resources where org_id = $1 and type = 'Encounter' and id = split_part(r, '/', 2)
	and not deleted and ($2 or synthetic))
	or exists (select 1 from fhir_typed_encounters where org_id = $1 and id = split_part(r, '/', 2) and ($2 or synthetic))
when 'Organization' then split_part(r, '/', 2) = $1 -- the tenant itself, as Patient.managingOrganization names it
	or exists (select 1 from fhir_resources where org_id = $1 and type = 'Organization' and id = split_part(r, '/', 2)
	and not deleted and ($2 or synthetic))
else exists (select 1 from fhir_resources where org_id = $1 and type = split_part(r, '/', 1) and id = split_part(r, '/', 2)
	and not deleted and ($2 or synthetic))
end)`, w.orgID, w.p.SeesRealPatients(), refs)
	missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("check references: %w", err)
	}
	return missing, nil
}

// conditionals is what a transaction's conditional references are resolved against besides the
// store: its own entries, and the references it has matched in the store already. A Synthea
// patient's hundreds of resources name the same few practitioners and organizations: one query
// each, not one a reference.
type conditionals struct {
	pending map[string]map[string][]string // Type → identifier token → Type/id, of the entries
	matched map[string]string              // Type?query → Type/id, matched in the store
	urls    map[string]string              // fullUrl → Type/id, of the entries given theirs so far
}

// resolveConditional replaces every conditional reference of doc (Type?identifier=system|value,
// as Synthea names its organizations and practitioners) by the one resource it matches: among
// c's pending entries (c may be nil: a write of one resource) first, then the stored resources
// the writer sees. None or several is a 422 naming the reference. A reference to an entry's
// fullUrl in c.urls is replaced by the entry's Type/id in the same walk.
func (s *Service) resolveConditional(ctx context.Context, tx pgx.Tx, w writer, doc resourceDoc, c *conditionals) error {
	if c == nil {
		c = &conditionals{}
	}
	var firstErr error
	walkRefs(map[string]any(doc), func(ref string) string {
		if to, ok := c.urls[ref]; ok {
			return to
		}
		t, query, ok := strings.Cut(ref, "?")
		if !ok || firstErr != nil || strings.Contains(t, "/") {
			return ref
		}
		if to, ok := c.matched[ref]; ok {
			return to
		}
		resolved, err := s.matchConditional(ctx, tx, w, t, query, c.pending)
		if err != nil {
			firstErr = fault.Validation("conditional reference "+ref+": "+err.Error(), map[string]string{"reference": ref + ": " + err.Error()})
			return ref
		}
		if c.matched != nil {
			c.matched[ref] = resolved
		}
		return resolved
	})
	return firstErr
}

func (s *Service) matchConditional(ctx context.Context, tx pgx.Tx, w writer, t, query string, pending map[string]map[string][]string) (string, error) {
	ident, err := ConditionIdentifier(query)
	if err != nil {
		return "", err
	}
	if list := pending[t][TokenValue(ident)]; len(list) > 0 {
		if len(list) > 1 {
			return "", errors.New("matches more than one entry of the transaction")
		}
		return list[0], nil
	}
	if !GenericType(t) && t != "Patient" {
		return "", fmt.Errorf("%s cannot be referred to by a condition", t)
	}
	id, err := matchResource(ctx, tx, w, t, ident, false)
	if err != nil {
		return "", err
	}
	if id == "" {
		return "", errors.New("matches no resource")
	}
	return t + "/" + id, nil
}

// ConditionIdentifier parses a condition (a conditional reference's query, If-None-Exist):
// identifier=[system|]value, the one condition supported.
func ConditionIdentifier(query string) (Identifier, error) {
	v, err := url.ParseQuery(query)
	v.Del("_format")
	if err != nil || len(v) != 1 || len(v["identifier"]) != 1 || v.Get("identifier") == "" || strings.Contains(v.Get("identifier"), ",") {
		return Identifier{}, errors.New("the condition must be identifier=system|value (the one condition supported)")
	}
	i := Identifier{Value: v.Get("identifier")}
	if sys, val, ok := strings.Cut(i.Value, "|"); ok {
		i = Identifier{System: sys, Value: val}
	}
	return i, nil
}

// matchResource returns the id of the one resource of type t the writer sees that carries
// ident, "" when none does; two are a Conflict. With lock it first holds a transaction lock on
// (organization, type, identifier), so that concurrent conditional creates run one at a time.
func matchResource(ctx context.Context, tx pgx.Tx, w writer, t string, ident Identifier, lock bool) (string, error) {
	if t == "Patient" {
		return matchIdentifier(ctx, tx, w.p, w.orgID, ident)
	}
	if lock {
		if _, err := tx.Exec(ctx, `select pg_advisory_xact_lock(hashtextextended($1, 0))`, conditionLock(w.orgID, t, ident)); err != nil {
			return "", err
		}
	}
	rows, _ := tx.Query(ctx, `select id from fhir_resources where org_id = $1 and type = $2 and identifiers @> array[$3]
and not deleted and ($4 or synthetic) order by id limit 2`, w.orgID, t, TokenValue(ident), w.p.SeesRealPatients())
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	switch {
	case err != nil:
		return "", err
	case len(found) > 1:
		return "", fault.Conflict("more than one %s carries identifier %s|%s", t, ident.System, ident.Value)
	case len(found) == 1:
		return found[0], nil
	}
	return "", nil
}

// conditionLock is the advisory lock key of a conditional create of t by ident in an organization.
func conditionLock(orgID, t string, ident Identifier) string {
	return "fhir-identifier|" + orgID + "|" + t + "|" + TokenValue(ident)
}

func currentDoc(ctx context.Context, tx pgx.Tx, orgID, t, id string) (json.RawMessage, error) {
	var doc json.RawMessage
	if err := tx.QueryRow(ctx, `select resource from fhir_resources where org_id = $1 and type = $2 and id = $3`, orgID, t, id).Scan(&doc); err != nil {
		return nil, err
	}
	return doc, nil
}
