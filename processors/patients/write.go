package patients

// Patient writes: POST /v1/patients and PUT /v1/patients/{id} (write:patients).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/storage/idempotency"
)

// Extensions under which a FHIR Patient carries carehub's risk level and care programs. REST
// reads render them from the stored columns; writes set the columns from them (a write without
// them leaves both as they are).
const (
	ExtensionRiskLevel = "https://carehub.example/fhir/StructureDefinition/risk-level"   // valueCode: low, moderate, high, critical
	ExtensionProgram   = "https://carehub.example/fhir/StructureDefinition/care-program" // valueString, repeated per program
)

// RiskLevels are the values of FHIRPatient.riskLevel (lowercase).
var RiskLevels = []string{"low", "moderate", "high", "critical"}

// genders is FHIR's administrative-gender value set.
var genders = []string{"male", "female", "other", "unknown"}

// testDataTag marks synthetic patients (FHIR's v3-ActReason HTEST, "test health data"). A live
// key creates a synthetic patient by sending it; a test key's patients always carry it.
const (
	testDataSystem = "http://terminology.hl7.org/CodeSystem/v3-ActReason"
	testDataCode   = "HTEST"
)

// patientInput is a validated FHIR Patient body.
type patientInput struct {
	doc         map[string]json.RawMessage // every element as sent, carehub's extensions removed
	name        json.RawMessage
	gender      *string
	birthDate   *string
	address     json.RawMessage
	telecom     json.RawMessage
	risk        *string  // set when the risk-level extension was sent
	programs    []string // the care-program extensions sent
	programsSet bool     // whether any care-program extension was sent
	testData    bool     // meta.tag carries HTEST
	orgRef      string   // managingOrganization.reference
}

type humanName struct {
	Family *string  `json:"family"`
	Given  []string `json:"given"`
	Text   *string  `json:"text"`
}

type extension struct {
	URL         string  `json:"url"`
	ValueCode   *string `json:"valueCode"`
	ValueString *string `json:"valueString"`
}

// parsePatient validates body as a FHIR R4 Patient: resourceType, at least one name with a
// family or given name, gender in administrative-gender, birthDate a FHIR date not in the
// future, address and telecom arrays of objects, carehub's extensions well-formed. Every
// problem is reported at once (422 with details.fields); a body that is not a JSON object is 400.
func parsePatient(body []byte, now time.Time) (*patientInput, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(body, &doc); err != nil || doc == nil {
		return nil, fault.Invalid("the body must be a FHIR Patient JSON object")
	}
	in := &patientInput{doc: doc}
	bad := map[string]string{}
	var rt string
	if err := json.Unmarshal(doc["resourceType"], &rt); err != nil || rt != "Patient" {
		bad["resourceType"] = "must be Patient"
	}
	var names []humanName
	if raw, ok := doc["name"]; !ok {
		bad["name"] = "is required: at least one HumanName with a family or given name"
	} else if err := json.Unmarshal(raw, &names); err != nil {
		bad["name"] = "must be an array of HumanName objects (family: string, given: [string])"
	} else if !slices.ContainsFunc(names, func(n humanName) bool {
		return n.Family != nil && strings.TrimSpace(*n.Family) != "" || slices.ContainsFunc(n.Given, func(g string) bool { return strings.TrimSpace(g) != "" })
	}) {
		bad["name"] = "needs at least one HumanName with a family or given name"
	} else {
		in.name = raw
	}
	if raw, ok := doc["gender"]; ok {
		var g string
		if err := json.Unmarshal(raw, &g); err != nil || !slices.Contains(genders, g) {
			bad["gender"] = "must be one of male, female, other, unknown"
		} else {
			in.gender = &g
		}
	}
	if raw, ok := doc["birthDate"]; ok {
		var d string
		if err := json.Unmarshal(raw, &d); err != nil || !validBirthDate(d, now) {
			bad["birthDate"] = "must be a FHIR date (YYYY, YYYY-MM or YYYY-MM-DD) from 1850 up to today"
		} else {
			in.birthDate = &d
		}
	}
	for _, f := range []struct {
		name string
		dst  *json.RawMessage
	}{{"address", &in.address}, {"telecom", &in.telecom}} {
		if raw, ok := doc[f.name]; ok {
			var list []map[string]json.RawMessage
			if err := json.Unmarshal(raw, &list); err != nil {
				bad[f.name] = "must be an array of objects"
			} else {
				*f.dst = raw
			}
		}
	}
	if raw, ok := doc["extension"]; ok {
		var exts []json.RawMessage
		if err := json.Unmarshal(raw, &exts); err != nil {
			bad["extension"] = "must be an array of Extension objects"
		} else {
			var keep []json.RawMessage
			for _, x := range exts {
				var e extension
				if err := json.Unmarshal(x, &e); err != nil {
					bad["extension"] = "must be an array of Extension objects"
					break
				}
				switch e.URL {
				case ExtensionRiskLevel:
					if e.ValueCode == nil || !slices.Contains(RiskLevels, *e.ValueCode) {
						bad["extension"] = "the risk-level extension needs valueCode low, moderate, high or critical"
					} else {
						in.risk = e.ValueCode
					}
				case ExtensionProgram:
					if e.ValueString == nil || strings.TrimSpace(*e.ValueString) == "" || utf8.RuneCountInString(*e.ValueString) > 100 {
						bad["extension"] = "the care-program extension needs a valueString of 1 to 100 characters"
					} else if prog := strings.TrimSpace(*e.ValueString); !slices.Contains(in.programs, prog) {
						in.programs = append(in.programs, prog)
					}
					in.programsSet = true
				default:
					keep = append(keep, x)
				}
			}
			if len(keep) > 0 {
				doc["extension"], _ = json.Marshal(keep)
			} else {
				delete(doc, "extension")
			}
		}
	}
	var meta struct {
		Tag []struct {
			System string `json:"system"`
			Code   string `json:"code"`
		} `json:"tag"`
	}
	if raw, ok := doc["meta"]; ok {
		if err := json.Unmarshal(raw, &meta); err != nil {
			bad["meta"] = "must be a Meta object"
		}
		for _, t := range meta.Tag {
			if t.System == testDataSystem && t.Code == testDataCode {
				in.testData = true
			}
		}
	}
	if raw, ok := doc["managingOrganization"]; ok {
		var ref struct {
			Reference string `json:"reference"`
		}
		if err := json.Unmarshal(raw, &ref); err != nil {
			bad["managingOrganization"] = "must be a Reference"
		}
		in.orgRef = ref.Reference
	}
	if len(bad) > 0 {
		return nil, fault.Validation("invalid FHIR Patient", bad)
	}
	return in, nil
}

// validBirthDate reports whether d is a FHIR date (YYYY, YYYY-MM or YYYY-MM-DD) between 1850
// and today.
func validBirthDate(d string, now time.Time) bool {
	var t time.Time
	var err error
	switch len(d) {
	case 4:
		t, err = time.Parse("2006", d)
	case 7:
		t, err = time.Parse("2006-01", d)
	case 10:
		t, err = time.Parse(time.DateOnly, d)
	default:
		return false
	}
	return err == nil && t.Year() >= 1850 && !t.After(now)
}

// resource returns the FHIR Patient to store for id: the body as sent with carehub's id,
// lastUpdated, the test-data tag when synthetic and the managing organization.
func (in *patientInput) resource(id, orgID string, synthetic bool, now time.Time) (json.RawMessage, error) {
	doc := in.doc
	doc["resourceType"] = json.RawMessage(`"Patient"`)
	doc["id"], _ = json.Marshal(id)
	meta := map[string]json.RawMessage{}
	if raw, ok := doc["meta"]; ok {
		_ = json.Unmarshal(raw, &meta) // checked by parsePatient
	}
	meta["lastUpdated"], _ = json.Marshal(now.UTC().Format(time.RFC3339Nano))
	if synthetic && !in.testData {
		var tags []json.RawMessage
		_ = json.Unmarshal(meta["tag"], &tags)
		tag, _ := json.Marshal(map[string]string{"system": testDataSystem, "code": testDataCode, "display": "test health data"})
		meta["tag"], _ = json.Marshal(append(tags, tag))
	}
	doc["meta"], _ = json.Marshal(meta)
	doc["managingOrganization"], _ = json.Marshal(map[string]string{"reference": "Organization/" + orgID})
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("encode patient: %w", err)
	}
	return b, nil
}

// CreatePatient creates a patient from a FHIR Patient body and returns it as REST serves it
// (PatientDocument). The id is carehub's (any id in the body is ignored, as FHIR create does).
// A test key creates synthetic patients only; a live key creates a synthetic one when the body
// carries the HTEST meta tag. The platform operator names the organization in
// managingOrganization. Requires write:patients.
func (s *Service) CreatePatient(ctx context.Context, body []byte) (json.RawMessage, error) {
	doc, _, err := s.createPatient(ctx, body, nil)
	return doc, err
}

// Identifier is a FHIR identifier token (system|value); an empty System matches any system.
type Identifier struct{ System, Value string }

// CreatePatientIfNoneExist is FHIR's conditional create (If-None-Exist: identifier=system|value):
// when a patient the caller may see already carries the identifier it is returned with created
// false and nothing is written; two carrying it are a Conflict (FHIR's 412). Concurrent calls with
// the same identifier create one patient. Requires write:patients.
func (s *Service) CreatePatientIfNoneExist(ctx context.Context, body []byte, ident Identifier) (doc json.RawMessage, created bool, err error) {
	return s.createPatient(ctx, body, &ident)
}

func (s *Service) createPatient(ctx context.Context, body []byte, cond *Identifier) (json.RawMessage, bool, error) {
	res, err := s.CreatePatients(ctx, []NewPatient{{Body: body, IfNoneExist: cond}})
	if err != nil {
		if entries, ok := InvalidEntries(err); ok {
			return nil, false, entries[0] // one entry: its own error
		}
		return nil, false, err
	}
	return res[0].Doc, res[0].Created, nil
}

// NewPatient is one patient to create: a FHIR Patient body, and for a conditional create the
// identifier that must not exist yet.
type NewPatient struct {
	Body        []byte
	IfNoneExist *Identifier
}

// CreatedPatient is the outcome of one NewPatient: the patient, and whether it was created (false:
// a conditional create found it).
type CreatedPatient struct {
	Doc     json.RawMessage
	Created bool
}

// CreatePatients creates patients in one transaction: all of them, or none when any is invalid
// (a Validation error whose Details["entries"] maps each invalid entry's index to its error).
// Requires write:patients.
func (s *Service) CreatePatients(ctx context.Context, list []NewPatient) ([]CreatedPatient, error) {
	p, err := access.Require(ctx, access.WritePatients)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	type prepared struct {
		in        *patientInput
		orgID, id string
		synthetic bool
		res       json.RawMessage
	}
	preps := make([]prepared, len(list))
	bad := map[int]*fault.Error{}
	for i, np := range list {
		in, err := parsePatient(np.Body, now)
		if err != nil {
			bad[i] = fault.As(err)
			continue
		}
		orgID := p.OrgID
		if p.Platform {
			ref, _ := strings.CutPrefix(in.orgRef, "Organization/")
			var exists bool
			if err := s.pool.QueryRow(ctx, `select exists(select 1 from organizations where id = $1)`, ref).Scan(&exists); err != nil {
				return nil, fmt.Errorf("create patient: %w", err)
			}
			if !exists {
				bad[i] = fault.Validation("invalid FHIR Patient", map[string]string{
					"managingOrganization": "the platform operator must name an existing organization: Organization/<id>"})
				continue
			}
			orgID = ref
		}
		synthetic := !p.SeesRealPatients() || in.testData
		id := ids.New(ids.Patient)
		res, err := in.resource(id, orgID, synthetic, now)
		if err != nil {
			return nil, err
		}
		preps[i] = prepared{in: in, orgID: orgID, id: id, synthetic: synthetic, res: res}
	}
	if len(bad) > 0 {
		first := -1
		for i := range bad {
			if first < 0 || i < first {
				first = i
			}
		}
		return nil, &fault.Error{Kind: fault.KindValidation, Message: bad[first].Message, Details: map[string]any{"entries": bad}}
	}
	out := make([]CreatedPatient, len(list))
	createdIDs := make([]string, len(list))
	err = idempotency.Tx(ctx, s.pool, &createdIDs, func(tx pgx.Tx) error {
		for i, pr := range preps {
			createdIDs[i], out[i] = pr.id, CreatedPatient{Created: true}
			if cond := list[i].IfNoneExist; cond != nil {
				existing, err := matchIdentifier(ctx, tx, p, pr.orgID, *cond)
				if err != nil {
					return err
				}
				if existing != "" {
					createdIDs[i], out[i].Created = existing, false
					continue
				}
			}
			in := pr.in
			programs := in.programs
			if programs == nil {
				programs = []string{}
			}
			_, err := tx.Exec(ctx, `insert into patients (id, org_id, synthetic, name, gender, birth_date, address, telecom,
	risk_level, programs, resource, created_at, updated_at)
values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12)`,
				pr.id, pr.orgID, pr.synthetic, in.name, in.gender, in.birthDate, nullRaw(in.address), nullRaw(in.telecom),
				in.risk, programs, pr.res, now)
			if err != nil {
				return err
			}
			if out[i].Doc, err = recordVersion(ctx, tx, pr.id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		if f := fault.As(err); f != nil {
			return nil, f
		}
		return nil, fmt.Errorf("create patient: %w", err)
	}
	for i, id := range createdIDs {
		access.Touch(ctx, access.KindPatient, id)
		if out[i].Doc == nil { // an existing match, or a replayed Idempotency-Key
			if out[i].Doc, err = s.renderPatientByID(ctx, s.pool, id); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// InvalidEntries returns the per-entry errors of a CreatePatients refusal, by entry index.
func InvalidEntries(err error) (map[int]*fault.Error, bool) {
	f := fault.As(err)
	if f == nil {
		return nil, false
	}
	entries, ok := f.Details["entries"].(map[int]*fault.Error)
	return entries, ok
}

// RemoveCreated deletes patients this caller has just created and nothing refers to yet: the
// FHIR base's undo of a transaction whose observations Kafka then refused.
func (s *Service) RemoveCreated(ctx context.Context, patientIDs []string) error {
	p, err := access.Require(ctx, access.WritePatients)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `delete from patient_versions where patient_id = any($1)`, patientIDs); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `delete from patients where id = any($1) and ($2 = '' or org_id = $2)`, patientIDs, p.OrgFilter())
		return err
	})
}

// matchIdentifier returns the id of the one patient of orgID visible to p that carries ident, ""
// when none does. It holds a transaction lock on (organization, identifier) first, so that
// concurrent conditional creates of one identifier run one after the other.
func matchIdentifier(ctx context.Context, tx pgx.Tx, p *access.Principal, orgID string, ident Identifier) (string, error) {
	if _, err := tx.Exec(ctx, `select pg_advisory_xact_lock(hashtextextended($1, 0))`,
		"patient-identifier|"+orgID+"|"+ident.System+"|"+ident.Value); err != nil {
		return "", err
	}
	match := map[string]string{"value": ident.Value}
	if ident.System != "" {
		match["system"] = ident.System
	}
	want, _ := json.Marshal([]map[string]string{match})
	rows, _ := tx.Query(ctx, `select id from patients where org_id = $1 and ($2 or synthetic)
and resource->'identifier' @> $3::jsonb order by id limit 2`, orgID, p.SeesRealPatients(), string(want))
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	switch {
	case err != nil:
		return "", err
	case len(found) > 1:
		return "", fault.Conflict("If-None-Exist: more than one patient carries identifier %s|%s", ident.System, ident.Value)
	case len(found) == 1:
		return found[0], nil
	}
	return "", nil
}

// recordVersion keeps the patient's current version (patient_versions) and returns it rendered.
func recordVersion(ctx context.Context, tx pgx.Tx, id string) (json.RawMessage, error) {
	rows, _ := tx.Query(ctx, `select `+patientDocumentColumns+` from patients where id = $1`, id)
	row, err := pgx.CollectOneRow(rows, pgx.RowToStructByName[patientRow])
	if err != nil {
		return nil, fmt.Errorf("patient %s: %w", id, err)
	}
	doc, err := renderPatient(&row)
	if err != nil {
		return nil, err
	}
	_, err = tx.Exec(ctx, `insert into patient_versions (patient_id, version_id, resource, updated_at) values ($1, $2, $3, $4)
on conflict do nothing`, id, row.VersionID, doc, row.UpdatedAt)
	return doc, err
}

// UpdatePatient replaces patient id with a FHIR Patient body (FHIR update) and returns it as
// REST serves it. The patient must be visible to the caller (else NotFound: another tenant's
// patient, or a real one under a test key); an id in the body must be id (else Invalid). The
// patient keeps its organization and its synthetic flag; risk level and programs change only
// when the body carries their extensions. Requires write:patients.
func (s *Service) UpdatePatient(ctx context.Context, id string, body []byte) (json.RawMessage, error) {
	return s.UpdatePatientIfMatch(ctx, id, body, 0)
}

// UpdatePatientIfMatch is UpdatePatient when the patient is at version ifMatch (FHIR's If-Match;
// 0 for any version), checked under the row lock the update takes, so that of concurrent writers
// holding the same version exactly one wins; the others get a *VersionConflict.
func (s *Service) UpdatePatientIfMatch(ctx context.Context, id string, body []byte, ifMatch int) (json.RawMessage, error) {
	p, err := access.Require(ctx, access.WritePatients)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	in, err := parsePatient(body, now)
	if err != nil {
		return nil, err
	}
	if raw, ok := in.doc["id"]; ok {
		var bodyID string
		if err := json.Unmarshal(raw, &bodyID); err != nil || bodyID != id {
			return nil, fault.Invalid("the body's id must be the id in the path (%s)", id)
		}
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("update patient %s: %w", id, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	var orgID string
	var synthetic bool
	var version int
	err = tx.QueryRow(ctx, `select org_id, synthetic, version_id from patients where `+scope+` and id = $3 for update`,
		p.OrgFilter(), p.SeesRealPatients(), id).Scan(&orgID, &synthetic, &version)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound("patient", id)
	}
	if err != nil {
		return nil, fmt.Errorf("update patient %s: %w", id, err)
	}
	if ifMatch != 0 && ifMatch != version {
		return nil, &VersionConflict{ID: id, Current: version, Expected: ifMatch}
	}
	// A patient written before versions were kept keeps the version this update replaces.
	if _, err := recordVersion(ctx, tx, id); err != nil {
		return nil, fmt.Errorf("update patient %s: %w", id, err)
	}
	res, err := in.resource(id, orgID, synthetic, now)
	if err != nil {
		return nil, err
	}
	_, err = tx.Exec(ctx, `update patients set name = $2, gender = $3, birth_date = $4, address = $5, telecom = $6,
	risk_level = case when $7 then $8 else risk_level end,
	programs = case when $9 then $10 else programs end,
	resource = $11, updated_at = $12, version_id = version_id + 1
where id = $1`,
		id, in.name, in.gender, in.birthDate, nullRaw(in.address), nullRaw(in.telecom),
		in.risk != nil, in.risk, in.programsSet, nonNilStrings(in.programs), res, now)
	if err != nil {
		return nil, fmt.Errorf("update patient %s: %w", id, err)
	}
	doc, err := recordVersion(ctx, tx, id)
	if err != nil {
		return nil, fmt.Errorf("update patient %s: %w", id, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("update patient %s: %w", id, err)
	}
	access.Touch(ctx, access.KindPatient, id)
	return doc, nil
}

func nullRaw(raw json.RawMessage) any {
	if len(raw) == 0 {
		return nil
	}
	return raw
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
