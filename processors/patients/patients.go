// Package patients serves FHIR R4 patients, observations and encounters from their typed tables,
// and every other R4 resource type from the generic store (resources.go, docs/FHIR.md "Resource
// types beyond the typed four"), with the FHIR base's searches, transactions and $everything.
//
// Access: patients and encounters need read:patients, observations read:observations. Tenancy
// as everywhere (another organization's patient is NOT_FOUND), and test mode: a test key sees
// only synthetic patients (synthetic = true) and their data; to it a real patient does not exist.
package patients

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/access"
	"carehub/kernel/fault"
)

// Patient is a FHIR Patient as stored.
type Patient struct {
	ID        string          `db:"id"`
	OrgID     string          `db:"org_id"`
	Synthetic bool            `db:"synthetic"`
	Name      json.RawMessage `db:"name"`   // [HumanName]
	Gender    *string         `db:"gender"` //
	BirthDate *string         `db:"birth_date"`
	Address   json.RawMessage `db:"address"` // [Address] or nil
	Telecom   json.RawMessage `db:"telecom"` // [ContactPoint] or nil
	RiskLevel *string         `db:"risk_level"`
	Programs  []string        `db:"programs"`
	UpdatedAt time.Time       `db:"updated_at"`
}

// Observation is a FHIR Observation as stored; Value and Unit mirror valueQuantity.
type Observation struct {
	ID          string          `db:"id"`
	PatientID   string          `db:"patient_id"`
	Status      string          `db:"status"`
	Code        json.RawMessage `db:"code"`
	LOINC       *string         `db:"loinc"`
	Subject     json.RawMessage `db:"subject"`
	Value       *float64        `db:"value"`
	Unit        *string         `db:"unit"`
	EffectiveAt *time.Time      `db:"effective_at"`
}

// ValueQuantity returns the FHIR Quantity of the observation, or nil when it has no value.
func (o *Observation) ValueQuantity() json.RawMessage {
	if o.Value == nil {
		return nil
	}
	q := map[string]any{"value": *o.Value}
	if o.Unit != nil {
		q["unit"], q["system"], q["code"] = *o.Unit, "http://unitsofmeasure.org", *o.Unit
	}
	b, _ := json.Marshal(q)
	return b
}

// Encounter is a FHIR Encounter as stored.
type Encounter struct {
	ID        string          `db:"id"`
	PatientID string          `db:"patient_id"`
	Status    string          `db:"status"`
	Class     json.RawMessage `db:"class"`
	Subject   json.RawMessage `db:"subject"`
	Period    json.RawMessage `db:"period"`
	CreatedAt time.Time       `db:"created_at"`
}

// Service reads patient data. It is safe for concurrent use.
type Service struct {
	pool *pgxpool.Pool
}

// New returns the service on pool.
func New(pool *pgxpool.Pool) *Service { return &Service{pool: pool} }

const patientColumns = `id, org_id, synthetic, name, gender, birth_date, address, telecom, risk_level, programs, updated_at`

// scope is the SQL condition of tenancy and test mode, with the org filter as $1 and whether real
// patients are visible as $2.
const scope = `($1 = '' or org_id = $1) and ($2 or synthetic)`

// Patient returns one patient the caller may see. Requires read:patients.
func (s *Service) Patient(ctx context.Context, id string) (*Patient, error) {
	p, err := access.Require(ctx, access.ReadPatients)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select `+patientColumns+` from patients where `+scope+` and id = $3`,
		p.OrgFilter(), p.SeesRealPatients(), id)
	pt, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Patient])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound("patient", id)
	}
	if err != nil {
		return nil, fmt.Errorf("patient %s: %w", id, err)
	}
	access.Touch(ctx, access.KindPatient, pt.ID)
	return pt, nil
}

// Filter selects patients; empty fields do not filter.
type Filter struct {
	RiskLevel     string // exact, lowercase
	Program       string // enrolled in this care program
	Limit, Offset int
}

// Patients returns a page of the patients the caller may see, ordered by id. Requires
// read:patients.
func (s *Service) Patients(ctx context.Context, f Filter) ([]Patient, error) {
	p, err := access.Require(ctx, access.ReadPatients)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select `+patientColumns+` from patients where `+scope+`
and ($3 = '' or risk_level = $3) and ($4 = '' or programs @> array[$4]) order by id limit $5 offset $6`,
		p.OrgFilter(), p.SeesRealPatients(), f.RiskLevel, f.Program, f.Limit, f.Offset)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[Patient])
	if err != nil {
		return nil, fmt.Errorf("patients: %w", err)
	}
	for i := range out {
		access.Touch(ctx, access.KindPatient, out[i].ID)
	}
	return out, nil
}

// ObservationFilter selects a patient's observations, newest first.
type ObservationFilter struct {
	Limit int       // 1..100
	Code  string    // LOINC code, "" for any
	Since time.Time // zero for any time
}

// ObservationsByPatient returns the observations of each patient among patientIDs that the caller
// may see, newest first, at most f.Limit per patient, in one statement (a batched loader).
// Requires read:observations.
func (s *Service) ObservationsByPatient(ctx context.Context, patientIDs []string, f ObservationFilter) (map[string][]Observation, error) {
	p, err := access.Require(ctx, access.ReadObservations)
	if err != nil {
		return nil, err
	}
	var since *time.Time
	if !f.Since.IsZero() {
		since = &f.Since
	}
	rows, _ := s.pool.Query(ctx, `select o.id, o.patient_id, o.status, coalesce(o.code, (o.resource->'code')::jsonb, '{}') as code, o.loinc,
	coalesce(o.subject, (o.resource->'subject')::jsonb, jsonb_build_object('reference', 'Patient/' || o.patient_id)) as subject,
	o.value, o.unit, o.effective_at
from patients pt cross join lateral (
	select * from observations o where o.patient_id = pt.id
	and ($3 = '' or o.loinc = $3) and ($4::timestamptz is null or o.effective_at >= $4)
	order by o.effective_at desc nulls last, o.id desc limit $5
) o
where pt.id = any($6) and ($1 = '' or pt.org_id = $1) and ($2 or pt.synthetic)`,
		p.OrgFilter(), p.SeesRealPatients(), f.Code, since, f.Limit, patientIDs)
	list, err := pgx.CollectRows(rows, pgx.RowToStructByName[Observation])
	if err != nil {
		return nil, fmt.Errorf("observations by patient: %w", err)
	}
	out := make(map[string][]Observation, len(patientIDs))
	for _, o := range list {
		out[o.PatientID] = append(out[o.PatientID], o)
		access.Touch(ctx, access.KindObservation, o.ID)
	}
	for id := range out {
		access.Touch(ctx, access.KindPatient, id)
	}
	return out, nil
}

// EncountersByPatient returns the encounters of each patient among patientIDs that the caller may
// see, newest first, at most limit per patient (a batched loader). Requires read:patients.
func (s *Service) EncountersByPatient(ctx context.Context, patientIDs []string, limit int) (map[string][]Encounter, error) {
	p, err := access.Require(ctx, access.ReadPatients)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select e.id, e.patient_id, e.status, e.class, e.subject, e.period, e.created_at
from patients pt cross join lateral (
	select * from encounters e where e.patient_id = pt.id order by e.created_at desc, e.id desc limit $3
) e
where pt.id = any($4) and ($1 = '' or pt.org_id = $1) and ($2 or pt.synthetic)`,
		p.OrgFilter(), p.SeesRealPatients(), limit, patientIDs)
	list, err := pgx.CollectRows(rows, pgx.RowToStructByName[Encounter])
	if err != nil {
		return nil, fmt.Errorf("encounters by patient: %w", err)
	}
	out := make(map[string][]Encounter, len(patientIDs))
	for _, e := range list {
		out[e.PatientID] = append(out[e.PatientID], e)
		access.Touch(ctx, access.KindEncounter, e.ID)
	}
	for id := range out {
		access.Touch(ctx, access.KindPatient, id)
	}
	return out, nil
}
