package patients

// FHIR Bulk Data Access v2 exports (docs/FHIR.md, "Bulk Data"): a kick-off records a job with the
// requester's credential, a runner on a processors node (bulk_runner.go) writes the NDJSON files
// part by part, and the requester polls the job and downloads its files. Every read of the stores
// is a search with the requester's credential, so tenancy, test mode and scopes hold as they do
// for a search: a test key's export holds only synthetic patients, another organization's
// resources are never read.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/klauspost/compress/s2"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/fhirjson"
	"carehub/kernel/ids"
)

// Export levels: the whole organization, every patient's compartment, or a Group's members'.
const (
	ExportSystem  = "system"
	ExportPatient = "patient"
	ExportGroup   = "group"
)

// Export statuses.
const (
	ExportInProgress = "in-progress"
	ExportCompleted  = "completed"
	ExportFailed     = "failed"
)

// MaxExportsInProgress bounds one organization's exports in progress at once; a kick-off past it
// is refused (429), as the Bulk Data specification lets a server do.
const MaxExportsInProgress = 4

// ExportRequest is a kick-off's parameters.
type ExportRequest struct {
	Level   string
	GroupID string            // ExportGroup: the Group whose members are exported
	Types   []string          // _type; empty: every type the level covers
	Since   *time.Time        // _since: resources changed at or after it
	Filters map[string]Search // _typeFilter: one search per type, its resources only those it matches
	// Patients (the POST kick-off's patient) are the only patients exported, at the Patient
	// level, or the Group's members among them.
	Patients []string
	Request  string // the kick-off URL, echoed in the manifest
}

// Export is a job as its requester sees it.
type Export struct {
	ID              string
	Status          string
	Request         string
	TransactionTime time.Time
	Types           []string
	Done            int   // types fully written
	Written         int64 // resources written so far
	Omitted         []string
	Error           string
	ExpiresAt       *time.Time
	Files           []ExportFile // completed exports only
}

// ExportFile is one NDJSON file of an export: part Part of type Type's resources.
type ExportFile struct {
	Type  string
	Part  int
	Count int
}

// observationTypes need read:observations besides read:patients (DECISIONS §2); an export whose
// credential lacks it leaves them out and says so in its manifest.
var observationTypes = []string{"Observation", "RiskAssessment"}

// StartExport records an export job for the caller and returns its id. Requires read:patients.
// The types are fixed now, as is the transaction time: the export holds no resource changed
// after it.
func (s *Service) StartExport(ctx context.Context, req ExportRequest) (string, error) {
	p, err := access.Require(ctx, access.ReadPatients)
	if err != nil {
		return "", err
	}
	var members []string
	if req.Level == ExportGroup {
		if members, err = s.groupMembers(ctx, req.GroupID); err != nil {
			return "", err
		}
	}
	if len(req.Patients) > 0 {
		if members, err = s.exportPatients(ctx, req, members); err != nil {
			return "", err
		}
	}
	types, err := s.exportTypes(ctx, p, req)
	if err != nil {
		return "", err
	}
	var omitted []string
	if !p.Has(access.ReadObservations) {
		types = slices.DeleteFunc(types, func(t string) bool {
			if slices.Contains(observationTypes, t) {
				omitted = append(omitted, t)
				return true
			}
			return false
		})
	}
	filters, err := json.Marshal(req.Filters)
	if err != nil {
		return "", err
	}
	id := ids.New(ids.Export)
	tag, err := s.pool.Exec(ctx, `insert into bulk_exports (id, org_id, key_id, mode, scopes, level, group_id, patients, request,
		types, filters, since, transaction_time, omitted)
		select $1, $2, $3, $4, $5, $6, nullif($7, ''), $8, $9, $10, $11, $12, now(), $13
		where (select count(*) from bulk_exports where org_id = $2 and status = 'in-progress') < $14`,
		id, p.OrgID, p.KeyID, p.Mode, p.Scopes, req.Level, req.GroupID, members, req.Request, types, filters, req.Since,
		nonNilStrings(omitted), MaxExportsInProgress)
	if err != nil {
		return "", fmt.Errorf("start export: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return "", fault.New(fault.KindRateLimited, "the organization has %d exports in progress, the most it may have at once; "+
			"retry when one completes, or cancel one", MaxExportsInProgress)
	}
	return id, nil
}

// exportPatients checks the patients an export is restricted to, each one the caller may read,
// and returns them, or at the Group level the members among them.
func (s *Service) exportPatients(ctx context.Context, req ExportRequest, members []string) ([]string, error) {
	if req.Level == ExportSystem {
		return nil, fault.Validation("patient restricts a Patient or Group export", map[string]string{
			"patient": "not a parameter of the system-level $export: use Patient/$export or Group/{id}/$export"})
	}
	for _, id := range req.Patients {
		if _, err := s.ReadResource(ctx, "Patient", id); err != nil {
			if fault.KindOf(err) == fault.KindNotFound {
				return nil, fault.Validation("a patient to export is not found", map[string]string{"patient": "Patient/" + ids.FHIR(id) + " is not found"})
			}
			return nil, err
		}
	}
	if req.Level != ExportGroup {
		return slices.Compact(slices.Sorted(slices.Values(req.Patients))), nil
	}
	return slices.DeleteFunc(members, func(m string) bool { return !slices.Contains(req.Patients, m) }), nil
}

// groupMembers returns the patients a Group the caller may read lists as its members (an
// inactive membership is not one), or, for a Group with characteristics and no member list, the
// patients that match them now (group_characteristics.go).
func (s *Service) groupMembers(ctx context.Context, groupID string) ([]string, error) {
	doc, err := s.ReadResource(ctx, "Group", groupID)
	if err != nil {
		return nil, err
	}
	var g struct {
		Member []struct {
			Entity   struct{ Reference string } `json:"entity"`
			Inactive bool                       `json:"inactive"`
		} `json:"member"`
	}
	if err := json.Unmarshal(doc, &g); err != nil {
		return nil, fmt.Errorf("group %s: %w", groupID, err)
	}
	members := []string{}
	for _, m := range g.Member {
		if ref, ok := strings.CutPrefix(m.Entity.Reference, "Patient/"); ok && ref != "" && !m.Inactive {
			members = append(members, ids.FromFHIR(ref))
		}
	}
	if len(g.Member) == 0 {
		chars, err := unmarshalCharacteristics(doc)
		if err != nil {
			return nil, fmt.Errorf("group %s: %w", groupID, err)
		}
		if len(chars) == 0 {
			return nil, fault.Validation("the group names no members", map[string]string{"group": "a Group export needs a Group " +
				"with member entries (Patient references) or characteristics"})
		}
		return s.characteristicMembers(ctx, chars)
	}
	return members, nil
}

// exportTypes are the types an export writes, in order: those asked for, or every type the
// caller's organization holds that the level covers (patient data only, below the system level).
func (s *Service) exportTypes(ctx context.Context, p *access.Principal, req ExportRequest) ([]string, error) {
	compartment := req.Level != ExportSystem
	if len(req.Types) > 0 {
		for _, t := range req.Types {
			if !slices.Contains(typedTypes, t) && !GenericType(t) {
				return nil, fault.Validation("unknown _type", map[string]string{"_type": t + " is not a resource type stored here"})
			}
			if compartment && !PatientData(t) {
				return nil, fault.Validation("not patient data", map[string]string{"_type": t +
					" is not in a patient's compartment: export it at the system level (" + "$export" + ")"})
			}
		}
		return slices.Compact(slices.Sorted(slices.Values(req.Types))), nil
	}
	types := append([]string{}, typedTypes...)
	types = append(types, "Encounter")
	// A _since export's types include those whose only resources since were deleted: its deleted
	// file lists them.
	rows, err := s.pool.Query(ctx, `select distinct type from fhir_resources where ($1 = '' or org_id = $1) and ($2 or synthetic)
		and (not deleted or last_updated >= $3)`, p.OrgFilter(), p.SeesRealPatients(), req.Since)
	if err != nil {
		return nil, fmt.Errorf("export types: %w", err)
	}
	present, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("export types: %w", err)
	}
	types = append(types, present...)
	types = slices.DeleteFunc(types, func(t string) bool { return compartment && !PatientData(t) })
	return slices.Compact(slices.Sorted(slices.Values(types))), nil
}

// ExportStatus returns export id as its requester sees it. Another credential, even of the same
// organization, gets NotFound: an export's files are its requester's (the Bulk Data
// specification's requiresAccessToken).
func (s *Service) ExportStatus(ctx context.Context, id string) (*Export, error) {
	p, err := access.Require(ctx, access.ReadPatients)
	if err != nil {
		return nil, err
	}
	e := &Export{ID: id}
	var position exportPosition
	var errText *string
	err = s.pool.QueryRow(ctx, `select status, request, transaction_time, types, position, written, omitted, error, expires_at
		from bulk_exports where id = $1 and key_id = $2 and (expires_at is null or expires_at > now())`, id, p.KeyID).
		Scan(&e.Status, &e.Request, &e.TransactionTime, &e.Types, &position, &e.Written, &e.Omitted, &errText, &e.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound("export", id)
	}
	if err != nil {
		return nil, fmt.Errorf("export status: %w", err)
	}
	e.Done = min(position.Written(), len(e.Types)) // past the types: the deleted resources of a _since export
	if errText != nil {
		e.Error = *errText
	}
	if e.Status != ExportCompleted {
		return e, nil
	}
	e.Done = len(e.Types)
	rows, err := s.pool.Query(ctx, `select type, part, count from bulk_export_files where export_id = $1 order by type, part`, id)
	if err != nil {
		return nil, fmt.Errorf("export files: %w", err)
	}
	e.Files, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (ExportFile, error) {
		var f ExportFile
		return f, row.Scan(&f.Type, &f.Part, &f.Count)
	})
	if err != nil {
		return nil, fmt.Errorf("export files: %w", err)
	}
	var stored int64
	for _, f := range e.Files {
		stored += int64(f.Count)
	}
	if stored != e.Written { // lost with the unlogged table (bulk_lost.go): made again
		if _, err := s.restartExport(ctx, id, `status = 'completed' and written = $2`, e.Written); err != nil {
			return nil, err
		}
		e.Status, e.Done, e.Written, e.ExpiresAt, e.Files = ExportInProgress, 0, 0, nil, nil
	}
	return e, nil
}

// CancelExport cancels export id, or deletes its files once complete: either way the job and
// whatever it wrote are gone. Only its requester may.
func (s *Service) CancelExport(ctx context.Context, id string) error {
	p, err := access.Require(ctx, access.ReadPatients)
	if err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, `delete from bulk_exports where id = $1 and key_id = $2`, id, p.KeyID)
	if err != nil {
		return fmt.Errorf("cancel export: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fault.NotFound("export", id)
	}
	return nil
}

// ExportFileData returns part part of type t's NDJSON of export id in the FHIR base's JSON form
// (kernel/fhirjson), for its requester, and records its patients and resources as read: the
// download's audit record names every patient the file holds.
func (s *Service) ExportFileData(ctx context.Context, id, t string, part int) ([]byte, error) {
	p, err := access.Require(ctx, access.ReadPatients)
	if err != nil {
		return nil, err
	}
	if slices.Contains(observationTypes, t) {
		if _, err := access.Require(ctx, access.ReadObservations); err != nil {
			return nil, err
		}
	}
	var data []byte
	var patients []string
	var fhirForm bool
	var coding string
	err = s.pool.QueryRow(ctx, `select f.ndjson, f.patient_ids, f.fhir_form, f.coding from bulk_export_files f join bulk_exports e on e.id = f.export_id
		where f.export_id = $1 and f.type = $2 and f.part = $3 and e.key_id = $4 and e.status = 'completed' and e.expires_at > now()`,
		id, t, part, p.KeyID).Scan(&data, &patients, &fhirForm, &coding)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound("export file", fmt.Sprintf("%s/%s.%d", id, t, part))
	}
	if err != nil {
		return nil, fmt.Errorf("export file: %w", err)
	}
	if coding == "s2" {
		if data, err = s2.Decode(nil, data); err != nil {
			return nil, fmt.Errorf("export file %s/%s.%d: %w", id, t, part, err)
		}
	}
	for _, pid := range patients {
		access.Touch(ctx, access.KindPatient, pid)
	}
	if !fhirForm { // written before the runner wrote FHIR form
		out := make([]byte, 0, len(data)+len(data)/16)
		for line := range bytes.Lines(data) {
			if out, err = fhirjson.AppendRewrite(out, bytes.TrimSuffix(line, []byte("\n"))); err != nil {
				return nil, fmt.Errorf("export file: %w", err)
			}
			out = append(out, '\n')
		}
		data = out
	}
	return data, nil
}
