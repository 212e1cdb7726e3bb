package patients

// FHIR search and reads behind the FHIR base (api/fhir): patients, observations, encounters and
// the RiskAssessments carehub writes (the reports table), as FHIR JSON with meta.versionId and
// meta.lastUpdated, carehub ids (the FHIR base maps them to FHIR ids).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/jsonwire"
)

// DateBound is one FHIR date condition: its prefix (eq, ne, gt, lt, ge, le, sa, eb; eq, ge, gt,
// le, lt are supported) and the interval [From, To) that the value's precision spans.
type DateBound struct {
	Prefix   string
	From, To time.Time
}

// SortKey orders search results: a search parameter name of the resource (see each Search
// method) or _id, _lastUpdated; Desc for a leading '-'.
type SortKey struct {
	Param string
	Desc  bool
}

// Search is a FHIR search. Within a list the values are alternatives (FHIR's comma); the
// parameters together must all hold. Which fields a resource reads is said by its method.
type Search struct {
	IDs         []string     // _id (carehub ids)
	Patients    []string     // patient / subject (carehub patient ids)
	Identifiers []Identifier // identifier
	Names       []string     // name: any part of a HumanName starts with it (case-insensitive)
	Families    []string     // family
	Genders     []string     // gender
	BirthDate   []DateBound  // birthdate
	Codes       []Identifier // code: system|code (System "" = any system)
	Categories  []Identifier // category
	Date        []DateBound  // date: Observation.effective, RiskAssessment.occurrence
	LastUpdated []DateBound  // _lastUpdated
	Encounters  []string     // encounter (carehub encounter ids; the generic store)
	Statuses    []Identifier // status (the generic store)
	Sort        []SortKey
	Count       int // page size, 0..1000 (0: total only)
	Offset      int

	FamiliesExact []string        // family:exact: the whole family name, as sent
	NamesExact    []string        // name:exact
	Missing       map[string]bool // param:missing=true|false (see each type's missing expressions)
	Quantities    []QuantityBound // value-quantity (Observation)
	Has           []HasClause     // _has on Patient
	// After is the position (the sort keys of the last row of the page before, as SearchPage.Next
	// gave it): the page starts after it (keyset paging), Offset is then 0.
	After   []*string
	NoTotal bool // _total=none: Total is not counted (-1)
	// Each, when set, is handed every match in order, from After on, as the stores read them:
	// one query for all of them instead of a page (Count, Offset and the total are not used).
	// position gives the After of the match just handed. A Bulk Data export reads a type so,
	// in bounded memory however large it is.
	Each func(doc json.RawMessage, patientID string, position func() []*string) error `json:"-"`
}

// SearchPage is one page of a search: the resources in order and the number of all matches.
type SearchPage struct {
	Resources  []json.RawMessage
	PatientIDs []string // the subject of each resource (the patient itself for a Patient)
	Total      int64    // -1 when not counted (NoTotal)
	// Next is the position of the page's last row when more rows follow (Search.After of the
	// next page), nil on the last page.
	Next []*string
}

// searchable is one resource type's table and columns.
type searchable struct {
	from    string // from clause; t is the resource's table, pt its patient
	columns string // select list rendered by render
	patient string // the column of the patient id
	date    string // the column of search parameter date ("" when none)
	updated string // the column of _lastUpdated
	kind    string // access.Kind… touched per resource ("": only its patient)
	render  func(pgx.CollectableRow) (rendered, error)
	scopes  []string
	missing map[string]string // param → the SQL that is true when the resource has no value for it
}

var (
	patientSearch = searchable{from: `patients t join patients pt on pt.id = t.id`,
		columns: prefixed("t.", patientDocumentColumns), patient: "t.id", updated: "t.updated_at",
		kind: access.KindPatient, scopes: []string{access.ReadPatients}, render: renderPatientRow, missing: patientMissing}
	observationSearch = searchable{from: `observations t join patients pt on pt.id = t.patient_id`,
		// code and subject only where the row keeps no resource (renderObservationRow): each is
		// a jsonb the server would otherwise write out as text for nothing.
		columns: `t.id, t.patient_id, t.status, case when t.resource is null then t.code end, case when t.resource is null then t.subject end,
			t.value, t.unit, t.effective_at, t.resource, t.stored_at`,
		patient: "t.patient_id", date: "t.effective_at", updated: "t.stored_at",
		kind: access.KindObservation, scopes: []string{access.ReadObservations}, render: renderObservationRow, missing: observationMissing}
	encounterSearch = searchable{from: `encounters t join patients pt on pt.id = t.patient_id`,
		columns: `t.id, t.patient_id, t.status, t.class, t.subject, t.period, t.created_at`,
		patient: "t.patient_id", updated: "t.created_at",
		kind: access.KindEncounter, scopes: []string{access.ReadPatients}, render: renderEncounterRow}
	riskSearch = searchable{from: `reports t join patients pt on pt.id = t.patient_id`,
		columns: `t.id, t.patient_id, t.resource, t.created_at`,
		patient: "t.patient_id", date: "t.created_at", updated: "t.created_at",
		scopes: []string{access.ReadPatients, access.ReadObservations}, render: renderRiskRow, missing: riskMissing}
)

// SearchPatients searches patients: IDs, Identifiers, Names, Families, Genders, BirthDate,
// LastUpdated; sort by _id, _lastUpdated, family, birthdate. Requires read:patients.
func (s *Service) SearchPatients(ctx context.Context, q Search) (SearchPage, error) {
	return s.search(ctx, patientSearch, q)
}

// SearchObservations searches observations: IDs, Patients, Codes, Categories, Date,
// LastUpdated; sort by date, _id, _lastUpdated (default newest date first). Requires
// read:observations.
func (s *Service) SearchObservations(ctx context.Context, q Search) (SearchPage, error) {
	return s.search(ctx, observationSearch, q)
}

// SearchEncounters searches encounters: IDs, Patients, LastUpdated. Requires read:patients.
func (s *Service) SearchEncounters(ctx context.Context, q Search) (SearchPage, error) {
	return s.search(ctx, encounterSearch, q)
}

// SearchRiskAssessments searches the RiskAssessments carehub wrote (NEWS2, qSOFA reports): IDs,
// Patients, Date, LastUpdated. Requires read:patients and read:observations (a score is computed
// from observation values).
func (s *Service) SearchRiskAssessments(ctx context.Context, q Search) (SearchPage, error) {
	return s.search(ctx, riskSearch, q)
}

// SearchType runs search q on type t: the typed tables' searches for Patient, Observation and
// RiskAssessment, the generic store for Encounter and every other type. The FHIR base's searches
// and the export runner both go through it.
func (s *Service) SearchType(ctx context.Context, t string, q Search) (SearchPage, error) {
	switch t {
	case "Patient":
		return s.SearchPatients(ctx, q)
	case "Observation":
		return s.SearchObservations(ctx, q)
	case "RiskAssessment":
		return s.SearchRiskAssessments(ctx, q)
	}
	return s.SearchResources(ctx, t, q)
}

// ReadResource returns one resource by type (Patient, Observation, RiskAssessment, or a type of
// the generic store, Encounter included: ReadGeneric) and carehub id; one the caller may not see
// is NotFound.
func (s *Service) ReadResource(ctx context.Context, resourceType, id string) (json.RawMessage, error) {
	var page SearchPage
	var err error
	q := Search{IDs: []string{id}, Count: 1}
	switch resourceType {
	case "Patient":
		page, err = s.SearchPatients(ctx, q)
	case "Observation":
		page, err = s.SearchObservations(ctx, q)
	case "RiskAssessment":
		page, err = s.SearchRiskAssessments(ctx, q)
	default: // Encounter too: the generic store serves the typed table's beside its own
		return s.ReadGeneric(ctx, resourceType, id)
	}
	if err != nil {
		return nil, err
	}
	if len(page.Resources) == 0 {
		return nil, fault.NotFound(resourceType, id)
	}
	return page.Resources[0], nil
}

// search runs q on one resource type: the caller's tenancy and test mode, the filters, a count
// of all matches and one page.
func (s *Service) search(ctx context.Context, r searchable, q Search) (SearchPage, error) {
	p, err := access.Require(ctx, r.scopes...)
	if err != nil {
		return SearchPage{}, err
	}
	w := &where{}
	w.add(`(%s = '' or pt.org_id = %[1]s) and (%s or pt.synthetic)`, p.OrgFilter(), p.SeesRealPatients())
	if len(q.IDs) > 0 {
		w.add(`t.id = any(%s)`, q.IDs)
	}
	if len(q.Patients) > 0 {
		w.add(r.patient+` = any(%s)`, q.Patients)
	}
	anyOf(w, q.Identifiers, func(i Identifier) string {
		return w.format(`(t.resource->'identifier')::jsonb @> %s::jsonb`, tokenJSON(i, "value"))
	})
	anyOf(w, q.Names, func(n string) string {
		return w.format(`exists (select 1 from jsonb_array_elements(t.name) n where n->>'family' ilike %[1]s or n->>'text' ilike %[1]s
or exists (select 1 from jsonb_array_elements_text(case jsonb_typeof(n->'given') when 'array' then n->'given' else '[]' end) g where g ilike %[1]s))`,
			likePrefix(n))
	})
	anyOf(w, q.Families, func(n string) string {
		return w.format(`exists (select 1 from jsonb_array_elements(t.name) n where n->>'family' ilike %s)`, likePrefix(n))
	})
	if len(q.Genders) > 0 {
		w.add(`t.gender = any(%s)`, q.Genders)
	}
	w.dates(q.BirthDate, `(case length(t.birth_date) when 4 then t.birth_date || '-01-01' when 7 then t.birth_date || '-01' else t.birth_date end)::date`)
	anyOf(w, q.Codes, func(c Identifier) string {
		return w.format(`coalesce(t.code, (t.resource->'code')::jsonb)->'coding' @> %s::jsonb`, tokenJSON(c, "code"))
	})
	anyOf(w, q.Categories, func(c Identifier) string {
		return w.format(`(t.resource->'category')::jsonb @> %s::jsonb`, `[{"coding":`+tokenJSON(c, "code")+`}]`)
	})
	if r.date != "" {
		w.dates(q.Date, r.date)
	}
	w.dates(q.LastUpdated, r.updated)
	if err := w.missing(q.Missing, r.missing); err != nil {
		return SearchPage{}, err
	}
	if err := w.quantities(q.Quantities); err != nil {
		return SearchPage{}, err
	}
	if r.patient == "t.id" { // Patient
		w.exacts(q.NamesExact, q.FamiliesExact)
		if len(q.Has) > 0 {
			if err := requireHas(ctx, q.Has); err != nil {
				return SearchPage{}, err
			}
			if err := w.has(q.Has); err != nil {
				return SearchPage{}, err
			}
		}
	}

	cols, err := r.orderBy(q.Sort)
	if err != nil {
		return SearchPage{}, err
	}
	return s.runSearch(ctx, r.from, r.columns, cols, w, q, r.render, func(res rendered) {
		if r.kind != "" {
			access.Touch(ctx, r.kind, res.id)
		}
		access.Touch(ctx, access.KindPatient, res.patientID)
	})
}

// runSearch counts the matches of w (unless q.NoTotal) and reads one page of them in order cols:
// after q.After (keyset) or at q.Offset. One row more than the page is read, to know whether a next
// page follows and give its position. render makes each row a resource; touch records it as read,
// once the page is read whole. With q.Each it streams every match instead (streamSearch).
func (s *Service) runSearch(ctx context.Context, from, columns string, cols []sortCol, w *where, q Search,
	render func(pgx.CollectableRow) (rendered, error), touch func(rendered)) (SearchPage, error) {
	page := SearchPage{Total: -1}
	batch := &pgx.Batch{}
	if !q.NoTotal && q.Each == nil {
		cond := strings.Join(w.conds, " and ")
		batch.Queue(`select count(*) from `+from+` where `+cond, w.args...).QueryRow(func(row pgx.Row) error { return row.Scan(&page.Total) })
	}
	if q.After != nil {
		if err := w.after(cols, q.After); err != nil {
			return SearchPage{}, err
		}
	}
	if q.Each != nil {
		return page, s.streamSearch(ctx, `select `+columns+`, `+cursorSQL(cols)+` from `+from+` where `+strings.Join(w.conds, " and ")+
			` order by `+orderSQL(cols), w.args, render, touch, q.Each)
	}
	var read []rendered
	if q.Count > 0 {
		cond := strings.Join(w.conds, " and ")
		args := append(append([]any{}, w.args...), q.Count+1, q.Offset)
		var last string
		n := 0
		batch.Queue(`select `+columns+`, `+cursorSQL(cols)+` from `+from+` where `+cond+` order by `+orderSQL(cols)+
			fmt.Sprintf(` limit $%d offset $%d`, len(args)-1, len(args)), args...).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				if n++; n > q.Count {
					page.Next = parseCursor(last)
					break
				}
				res, err := render(cursorRow{Rows: rows, cursor: &last})
				if err != nil {
					return err
				}
				page.Resources = append(page.Resources, res.doc)
				page.PatientIDs = append(page.PatientIDs, res.patientID)
				res.doc = nil
				read = append(read, res)
			}
			return rows.Err()
		})
	}
	if err := s.pool.SendBatch(ctx, batch).Close(); err != nil {
		return SearchPage{}, searchFailed(err)
	}
	for _, res := range read {
		touch(res)
	}
	return page, nil
}

// streamSearch runs the search query sql and hands each row, rendered, to each, in order, with
// its position; each row is recorded as read (touch) as it is handed out.
func (s *Service) streamSearch(ctx context.Context, sql string, args []any, render func(pgx.CollectableRow) (rendered, error),
	touch func(rendered), each func(json.RawMessage, string, func() []*string) error) error {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return searchFailed(err)
	}
	defer rows.Close()
	var last string
	position := func() []*string { return parseCursor(last) }
	for rows.Next() {
		res, err := render(cursorRow{Rows: rows, cursor: &last})
		if err != nil {
			return err
		}
		touch(res)
		if err := each(res.doc, res.patientID, position); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return searchFailed(err)
	}
	return nil
}

// searchFailed is the error of a search the stores did not answer: a fault as it is, anything
// else wrapped.
func searchFailed(err error) error {
	if f := fault.As(err); f != nil {
		return f
	}
	return fmt.Errorf("search: %w", err)
}

// requireHas checks the scopes a _has needs: reading its type (Observation: read:observations).
func requireHas(ctx context.Context, clauses []HasClause) error {
	for _, c := range clauses {
		scopes := readScopes(c.Type)
		if c.Type == "Observation" {
			scopes = []string{access.ReadObservations}
		}
		if _, err := access.Require(ctx, scopes...); err != nil {
			return err
		}
	}
	return nil
}

// orderBy is the ORDER BY of sort keys; ties break by id.
func (r searchable) orderBy(keys []SortKey) ([]sortCol, error) {
	cols := map[string]sortCol{"_id": {expr: "t.id", typ: "text", notNull: true}, "_lastUpdated": {expr: r.updated, typ: "timestamptz", notNull: true}}
	if r.date != "" {
		cols["date"] = sortCol{expr: r.date, typ: "timestamptz"}
	}
	if r.patient == "t.id" { // Patient
		cols["family"] = sortCol{expr: `(t.name->0->>'family')`, typ: "text"}
		cols["given"] = sortCol{expr: `(t.name->0->'given'->>0)`, typ: "text"}
		cols["birthdate"] = sortCol{expr: `t.birth_date`, typ: "text"}
		cols["gender"] = sortCol{expr: `t.gender`, typ: "text"}
	}
	if r.missing["value-quantity"] != "" { // Observation
		cols["value-quantity"] = sortCol{expr: `t.value`, typ: "float8"}
	}
	if len(keys) == 0 && r.date != "" {
		keys = []SortKey{{Param: "date", Desc: true}}
	}
	var out []sortCol
	for _, k := range keys {
		col, ok := cols[k.Param]
		if !ok {
			return nil, fault.Validation("unsupported _sort", map[string]string{"_sort": fmt.Sprintf("cannot sort by %q", k.Param)})
		}
		col.desc = k.Desc
		out = append(out, col)
	}
	return tieBreak(out, sortCol{expr: "t.id", typ: "text", notNull: true}), nil
}

// where builds a WHERE clause with numbered arguments.
type where struct {
	conds []string
	args  []any
}

// format replaces each %s (or %[n]s) of f with a placeholder for the matching value.
func (w *where) format(f string, vals ...any) string {
	ph := make([]any, len(vals))
	for i, v := range vals {
		w.args = append(w.args, v)
		ph[i] = "$" + strconv.Itoa(len(w.args))
	}
	return fmt.Sprintf(f, ph...)
}

func (w *where) add(f string, vals ...any) { w.conds = append(w.conds, w.format(f, vals...)) }

// anyOf adds the disjunction of one condition per value (a FHIR comma list).
func anyOf[T any](w *where, vals []T, cond func(T) string) {
	if len(vals) == 0 {
		return
	}
	parts := make([]string, len(vals))
	for i, v := range vals {
		parts[i] = cond(v)
	}
	w.conds = append(w.conds, "("+strings.Join(parts, " or ")+")")
}

// dates adds each date condition on col (all must hold).
func (w *where) dates(bounds []DateBound, col string) {
	for _, b := range bounds {
		switch b.Prefix {
		case "ge":
			w.add(col+` >= %s`, b.From)
		case "gt":
			w.add(col+` >= %s`, b.To)
		case "le":
			w.add(col+` < %s`, b.To)
		case "lt":
			w.add(col+` < %s`, b.From)
		default: // eq
			w.add(col+` >= %s and `+col+` < %s`, b.From, b.To)
		}
	}
}

// tokenJSON is the jsonb containment pattern of a token: [{"system": …, key: …}].
func tokenJSON(i Identifier, key string) string {
	m := map[string]string{key: i.Value}
	if i.System != "" {
		m["system"] = i.System
	}
	b, _ := json.Marshal([]map[string]string{m})
	return string(b)
}

// likePrefix is the ILIKE pattern of a FHIR string search: starts with s, wildcards escaped.
func likePrefix(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s) + "%"
}

// rendered is one row of a search as a FHIR resource: its JSON, id, patient and lastUpdated.
type rendered struct {
	doc                json.RawMessage
	typ, id, patientID string // typ: the generic store's rows only
	updated            time.Time
}

func renderPatientRow(row pgx.CollectableRow) (rendered, error) {
	r, err := pgx.RowToStructByName[patientRow](row)
	if err != nil {
		return rendered{}, err
	}
	doc, err := renderPatient(&r)
	return rendered{doc: doc, id: r.ID, patientID: r.ID, updated: r.UpdatedAt}, err
}

func renderObservationRow(row pgx.CollectableRow) (rendered, error) {
	var o Observation
	var code, subject, resource []byte // raw: the stores' JSON is valid, and is checked once below
	var stored time.Time
	if err := row.Scan(&o.ID, &o.PatientID, &o.Status, &code, &subject, &o.Value, &o.Unit, &o.EffectiveAt, &resource, &stored); err != nil {
		return rendered{}, err
	}
	if len(resource) > 0 && string(resource) != "null" {
		doc, err := appendWithMeta(nil, resource, "Observation", o.ID, "1", stored)
		if err != nil {
			return rendered{}, fmt.Errorf("observation %s: stored resource: %w", o.ID, err)
		}
		return rendered{doc: doc, id: o.ID, patientID: o.PatientID, updated: stored}, nil
	}
	// Rows written without a resource: the elements carehub keeps.
	o.Code, o.Subject = code, subject
	doc := map[string]any{"status": o.Status, "code": o.Code, "subject": o.Subject}
	if o.EffectiveAt != nil {
		doc["effectiveDateTime"] = o.EffectiveAt.UTC().Format(time.RFC3339Nano)
	}
	if q := o.ValueQuantity(); q != nil {
		doc["valueQuantity"] = q
	}
	return rendered{doc: withMeta(doc, "Observation", o.ID, "1", stored), id: o.ID, patientID: o.PatientID, updated: stored}, nil
}

func renderEncounterRow(row pgx.CollectableRow) (rendered, error) {
	var e Encounter
	if err := row.Scan(&e.ID, &e.PatientID, &e.Status, &e.Class, &e.Subject, &e.Period, &e.CreatedAt); err != nil {
		return rendered{}, err
	}
	doc := map[string]any{"status": e.Status, "class": e.Class, "subject": e.Subject}
	if len(e.Period) > 0 && string(e.Period) != "null" {
		doc["period"] = e.Period
	}
	return rendered{doc: withMeta(doc, "Encounter", e.ID, "1", e.CreatedAt), id: e.ID, patientID: e.PatientID, updated: e.CreatedAt}, nil
}

func renderRiskRow(row pgx.CollectableRow) (rendered, error) {
	var id, patientID string
	var resource []byte
	var created time.Time
	if err := row.Scan(&id, &patientID, &resource, &created); err != nil {
		return rendered{}, err
	}
	doc, err := appendWithMeta(nil, resource, "RiskAssessment", id, "1", created)
	if err != nil {
		return rendered{}, fmt.Errorf("report %s: %w", id, err)
	}
	return rendered{doc: doc, id: id, patientID: patientID, updated: created}, nil
}

// withMeta sets resourceType, id and meta.versionId/lastUpdated of doc and encodes it.
func withMeta(doc map[string]any, resourceType, id, version string, updated time.Time) json.RawMessage {
	doc["resourceType"], doc["id"] = resourceType, id
	meta, _ := doc["meta"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["versionId"], meta["lastUpdated"] = version, updated.UTC().Format(time.RFC3339Nano)
	doc["meta"] = meta
	b, _ := json.Marshal(doc)
	return b
}

// clientIDSystem is the identifier system of the id a client gave a resource carehub stores
// under its own id: the client's id was the key of its retries, and stays as an identifier.
const clientIDSystem = "urn:carehub:client-id"

// appendWithMeta appends the stored resource obj (a JSON object) to dst as withMeta encodes it,
// without decoding it: resourceType, id and meta (versionId and lastUpdated set, its other
// members kept) first, then obj's other members as they stand, compacted. A stored id other than
// id is kept as an identifier (clientIDSystem). obj that is not one valid JSON object is an
// error.
func appendWithMeta(dst, obj []byte, resourceType, id, version string, updated time.Time) (json.RawMessage, error) {
	if !jsonwire.Valid(obj) || obj[jsonwire.SkipSpace(obj, 0)] != '{' {
		return nil, errors.New("not a JSON object")
	}
	var meta, identifier, clientID []byte
	_ = jsonwire.Members(obj, func(key, value []byte) error {
		switch string(key) {
		case "meta":
			meta = value
		case "identifier":
			identifier = value
		case "id":
			if value[0] == '"' {
				clientID = value
			}
		}
		return nil
	})
	dst = append(dst, `{"resourceType":`...)
	dst = jsonwire.AppendString(dst, resourceType)
	dst = append(dst, `,"id":`...)
	dst = jsonwire.AppendString(dst, id)
	dst = append(dst, `,"meta":{"versionId":`...)
	dst = jsonwire.AppendString(dst, version)
	dst = append(dst, `,"lastUpdated":"`...)
	dst = updated.UTC().AppendFormat(dst, time.RFC3339Nano)
	dst = append(dst, '"')
	_ = jsonwire.MemberSpans(meta, func(key, _ []byte, start, end int) error {
		if k := string(key); k != "versionId" && k != "lastUpdated" {
			dst = append(dst, ',')
			dst = jsonwire.AppendCompactValid(dst, meta[start:end])
		}
		return nil
	})
	dst = append(dst, '}')
	_ = jsonwire.MemberSpans(obj, func(key, _ []byte, start, end int) error {
		switch string(key) {
		case "resourceType", "id", "meta", "identifier":
		default:
			dst = append(dst, ',')
			dst = jsonwire.AppendCompactValid(dst, obj[start:end])
		}
		return nil
	})
	var client string
	if clientID != nil {
		_ = jsonwire.String(clientID, &client)
	}
	switch {
	case client != "" && client != id:
		dst = append(dst, `,"identifier":[`...)
		_ = jsonwire.Elements(identifier, func(e []byte) error {
			dst = jsonwire.AppendCompactValid(dst, e)
			dst = append(dst, ',')
			return nil
		})
		dst = append(dst, `{"system":"`+clientIDSystem+`","value":`...)
		dst = jsonwire.AppendString(dst, client)
		dst = append(dst, "}]"...)
	case identifier != nil:
		dst = append(dst, `,"identifier":`...)
		dst = jsonwire.AppendCompactValid(dst, identifier)
	}
	return append(dst, '}'), nil
}

// prefixed qualifies every column of a comma-separated list with prefix.
func prefixed(prefix, columns string) string {
	parts := strings.Split(columns, ",")
	for i, c := range parts {
		parts[i] = prefix + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}
