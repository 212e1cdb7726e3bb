package patients

// REST reads: FHIR JSON documents of patients and of a patient's observations, with cursor
// pagination (GET /v1/patients, /v1/patients/{id}, /v1/patients/{id}/observations).

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/access"
	"carehub/kernel/fault"
)

// ErrBadPageCursor is returned for a cursor this service did not produce (400).
var ErrBadPageCursor = fault.Invalid("invalid cursor: pass the meta.cursor of an earlier response unchanged")

// PatientListQuery selects a page of patients; empty fields do not filter.
type PatientListQuery struct {
	RiskLevel string // exact, lowercase
	Program   string // enrolled in this care program
	Limit     int    // 1..100
	Cursor    string // from an earlier page's NextCursor
}

// PatientListPage is one page of patients as FHIR Patient JSON, in id (creation) order. Total
// counts every patient matching the query.
type PatientListPage struct {
	Patients   []json.RawMessage
	Total      int64
	NextCursor string // "" on the last page
}

// ObservationListQuery selects a page of one patient's observations, newest first.
type ObservationListQuery struct {
	Code   string    // LOINC code, "" for any
	Since  time.Time // effective at or after; zero for any
	Limit  int       // 1..1000
	Cursor string
}

// ObservationListPage is one page of observations as FHIR Observation JSON, newest
// effectiveDateTime first (ties by id). Total counts every observation matching the query.
type ObservationListPage struct {
	Observations []json.RawMessage
	Total        int64
	NextCursor   string
}

// patientRow is what rendering a patient reads.
type patientRow struct {
	ID        string          `db:"id"`
	OrgID     string          `db:"org_id"`
	Synthetic bool            `db:"synthetic"`
	Name      json.RawMessage `db:"name"`
	Gender    *string         `db:"gender"`
	BirthDate *string         `db:"birth_date"`
	Address   json.RawMessage `db:"address"`
	Telecom   json.RawMessage `db:"telecom"`
	RiskLevel *string         `db:"risk_level"`
	Programs  []string        `db:"programs"`
	Resource  json.RawMessage `db:"resource"`
	UpdatedAt time.Time       `db:"updated_at"`
	VersionID int             `db:"version_id"`
}

const patientDocumentColumns = `id, org_id, synthetic, name, gender, birth_date, address, telecom, risk_level, programs, resource, updated_at, version_id`

// PatientDocument returns patient id as FHIR Patient JSON: the resource as last written, with
// carehub's id, the risk level and care programs as extensions (ExtensionRiskLevel,
// ExtensionProgram), and the HTEST tag when synthetic. A patient the caller may not see is
// NotFound. Requires read:patients.
func (s *Service) PatientDocument(ctx context.Context, id string) (json.RawMessage, error) {
	p, err := access.Require(ctx, access.ReadPatients)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select `+patientDocumentColumns+` from patients where `+scope+` and id = $3`,
		p.OrgFilter(), p.SeesRealPatients(), id)
	row, err := pgx.CollectOneRow(rows, pgx.RowToStructByName[patientRow])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound("patient", id)
	}
	if err != nil {
		return nil, fmt.Errorf("patient %s: %w", id, err)
	}
	access.Touch(ctx, access.KindPatient, id)
	return renderPatient(&row)
}

// renderPatientByID renders a patient the caller has just written (no read scope needed).
func (s *Service) renderPatientByID(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, id string) (json.RawMessage, error) {
	rows, _ := q.Query(ctx, `select `+patientDocumentColumns+` from patients where id = $1`, id)
	row, err := pgx.CollectOneRow(rows, pgx.RowToStructByName[patientRow])
	if err != nil {
		return nil, fmt.Errorf("patient %s: %w", id, err)
	}
	return renderPatient(&row)
}

// ListPatientDocuments returns a page of the patients the caller may see. Requires
// read:patients.
func (s *Service) ListPatientDocuments(ctx context.Context, q PatientListQuery) (PatientListPage, error) {
	p, err := access.Require(ctx, access.ReadPatients)
	if err != nil {
		return PatientListPage{}, err
	}
	after := ""
	if q.Cursor != "" {
		if after, err = decodePageCursor(q.Cursor, "p"); err != nil {
			return PatientListPage{}, ErrBadPageCursor
		}
	}
	const filter = scope + ` and ($3 = '' or risk_level = $3) and ($4 = '' or programs @> array[$4])`
	var page PatientListPage
	var list []patientRow
	batch := &pgx.Batch{}
	batch.Queue(`select `+patientDocumentColumns+` from patients where `+filter+` and ($5 = '' or id > $5) order by id limit $6`,
		p.OrgFilter(), p.SeesRealPatients(), q.RiskLevel, q.Program, after, q.Limit+1).Query(func(rows pgx.Rows) error {
		var err error
		list, err = pgx.CollectRows(rows, pgx.RowToStructByName[patientRow])
		return err
	})
	batch.Queue(`select count(*) from patients where `+filter, p.OrgFilter(), p.SeesRealPatients(), q.RiskLevel, q.Program).
		QueryRow(func(row pgx.Row) error { return row.Scan(&page.Total) })
	if err := s.pool.SendBatch(ctx, batch).Close(); err != nil {
		return PatientListPage{}, fmt.Errorf("patients: %w", err)
	}
	if len(list) > q.Limit {
		list = list[:q.Limit]
		page.NextCursor = encodePageCursor("p", list[len(list)-1].ID)
	}
	page.Patients = make([]json.RawMessage, len(list))
	for i := range list {
		access.Touch(ctx, access.KindPatient, list[i].ID)
		if page.Patients[i], err = renderPatient(&list[i]); err != nil {
			return PatientListPage{}, err
		}
	}
	return page, nil
}

// ListObservationDocuments returns a page of the observations of patient patientID, newest
// first. A patient the caller may not see is NotFound, whatever observations it has. Requires
// read:observations.
func (s *Service) ListObservationDocuments(ctx context.Context, patientID string, q ObservationListQuery) (ObservationListPage, error) {
	p, err := access.Require(ctx, access.ReadObservations)
	if err != nil {
		return ObservationListPage{}, err
	}
	var afterAt time.Time
	afterID := ""
	if q.Cursor != "" {
		c, err := decodePageCursor(q.Cursor, "o")
		if err != nil {
			return ObservationListPage{}, ErrBadPageCursor
		}
		at, id, ok := strings.Cut(c, "|")
		if afterAt, err = time.Parse(time.RFC3339Nano, at); !ok || err != nil || id == "" {
			return ObservationListPage{}, ErrBadPageCursor
		}
		afterID = id
	}
	var since *time.Time
	if !q.Since.IsZero() {
		since = &q.Since
	}
	var visible bool
	if err := s.pool.QueryRow(ctx, `select exists(select 1 from patients where `+scope+` and id = $3)`,
		p.OrgFilter(), p.SeesRealPatients(), patientID).Scan(&visible); err != nil {
		return ObservationListPage{}, fmt.Errorf("observations of %s: %w", patientID, err)
	}
	if !visible {
		return ObservationListPage{}, fault.NotFound("patient", patientID)
	}
	// Newest first with ties by id ascending: the order of the observations_patient index
	// (patient_id, effective_at desc, id), so a page is a range scan of it.
	const filter = `patient_id = $1 and effective_at is not null and ($2 = '' or loinc = $2) and ($3::timestamptz is null or effective_at >= $3)`
	type obsRow struct {
		ID          string          `db:"id"`
		Status      string          `db:"status"`
		Code        json.RawMessage `db:"code"`
		Subject     json.RawMessage `db:"subject"`
		Value       *float64        `db:"value"`
		Unit        *string         `db:"unit"`
		EffectiveAt time.Time       `db:"effective_at"`
		Resource    json.RawMessage `db:"resource"`
	}
	var list []obsRow
	var page ObservationListPage
	batch := &pgx.Batch{}
	batch.Queue(`select id, status, code, subject, value, unit, effective_at, resource from observations
where `+filter+` and ($4 = '' or effective_at < $5 or (effective_at = $5 and id > $4))
order by effective_at desc, id limit $6`, patientID, q.Code, since, afterID, afterAt, q.Limit+1).Query(func(rows pgx.Rows) error {
		var err error
		list, err = pgx.CollectRows(rows, pgx.RowToStructByName[obsRow])
		return err
	})
	batch.Queue(`select count(*) from observations where `+filter, patientID, q.Code, since).
		QueryRow(func(row pgx.Row) error { return row.Scan(&page.Total) })
	if err := s.pool.SendBatch(ctx, batch).Close(); err != nil {
		return ObservationListPage{}, fmt.Errorf("observations of %s: %w", patientID, err)
	}
	if len(list) > q.Limit {
		list = list[:q.Limit]
		last := list[len(list)-1]
		page.NextCursor = encodePageCursor("o", last.EffectiveAt.UTC().Format(time.RFC3339Nano)+"|"+last.ID)
	}
	access.Touch(ctx, access.KindPatient, patientID)
	page.Observations = make([]json.RawMessage, len(list))
	for i, o := range list {
		access.Touch(ctx, access.KindObservation, o.ID)
		if len(o.Resource) > 0 && string(o.Resource) != "null" {
			page.Observations[i] = o.Resource
			continue
		}
		// Rows written without a resource: rebuild the elements carehub keeps.
		doc := map[string]any{"resourceType": "Observation", "id": o.ID, "status": o.Status, "code": o.Code,
			"subject": o.Subject, "effectiveDateTime": o.EffectiveAt.UTC().Format(time.RFC3339Nano)}
		if o.Value != nil {
			q := map[string]any{"value": *o.Value}
			if o.Unit != nil {
				q["unit"] = *o.Unit
			}
			doc["valueQuantity"] = q
		}
		if page.Observations[i], err = json.Marshal(doc); err != nil {
			return ObservationListPage{}, fmt.Errorf("observation %s: %w", o.ID, err)
		}
	}
	return page, nil
}

// renderPatient builds the FHIR Patient of a row (see PatientDocument).
func renderPatient(r *patientRow) (json.RawMessage, error) {
	doc := map[string]json.RawMessage{}
	if len(r.Resource) > 0 && string(r.Resource) != "null" {
		if err := json.Unmarshal(r.Resource, &doc); err != nil {
			return nil, fmt.Errorf("patient %s: stored resource: %w", r.ID, err)
		}
	} else {
		doc["name"] = r.Name
		if r.Gender != nil {
			doc["gender"], _ = json.Marshal(*r.Gender)
		}
		if r.BirthDate != nil {
			doc["birthDate"], _ = json.Marshal(*r.BirthDate)
		}
		if len(r.Address) > 0 && string(r.Address) != "null" {
			doc["address"] = r.Address
		}
		if len(r.Telecom) > 0 && string(r.Telecom) != "null" {
			doc["telecom"] = r.Telecom
		}
		doc["managingOrganization"], _ = json.Marshal(map[string]string{"reference": "Organization/" + r.OrgID})
	}
	doc["resourceType"] = json.RawMessage(`"Patient"`)
	doc["id"], _ = json.Marshal(r.ID)

	var exts []json.RawMessage
	if raw, ok := doc["extension"]; ok {
		var all []json.RawMessage
		_ = json.Unmarshal(raw, &all)
		for _, x := range all {
			var e extension
			if json.Unmarshal(x, &e) == nil && (e.URL == ExtensionRiskLevel || e.URL == ExtensionProgram) {
				continue // the columns are authoritative
			}
			exts = append(exts, x)
		}
	}
	if r.RiskLevel != nil && *r.RiskLevel != "" {
		x, _ := json.Marshal(map[string]string{"url": ExtensionRiskLevel, "valueCode": *r.RiskLevel})
		exts = append(exts, x)
	}
	for _, prog := range r.Programs {
		x, _ := json.Marshal(map[string]string{"url": ExtensionProgram, "valueString": prog})
		exts = append(exts, x)
	}
	if len(exts) > 0 {
		doc["extension"], _ = json.Marshal(exts)
	} else {
		delete(doc, "extension")
	}
	meta := map[string]json.RawMessage{}
	_ = json.Unmarshal(doc["meta"], &meta)
	meta["versionId"], _ = json.Marshal(strconv.Itoa(r.VersionID))
	meta["lastUpdated"], _ = json.Marshal(r.UpdatedAt.UTC().Format(time.RFC3339Nano))
	if r.Synthetic {
		var tags []struct {
			System string `json:"system"`
			Code   string `json:"code"`
		}
		_ = json.Unmarshal(meta["tag"], &tags)
		tagged := false
		for _, t := range tags {
			tagged = tagged || t.System == testDataSystem && t.Code == testDataCode
		}
		if !tagged {
			var raw []json.RawMessage
			_ = json.Unmarshal(meta["tag"], &raw)
			tag, _ := json.Marshal(map[string]string{"system": testDataSystem, "code": testDataCode, "display": "test health data"})
			meta["tag"], _ = json.Marshal(append(raw, tag))
		}
	}
	doc["meta"], _ = json.Marshal(meta)
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("patient %s: %w", r.ID, err)
	}
	return b, nil
}

// Page cursors are opaque to clients: base64url of a kind letter and the position.
func encodePageCursor(kind, pos string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(kind + ":" + pos))
}

func decodePageCursor(c, kind string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return "", err
	}
	pos, ok := strings.CutPrefix(string(b), kind+":")
	if !ok || pos == "" {
		return "", errors.New("cursor of another listing")
	}
	return pos, nil
}
