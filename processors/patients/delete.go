package patients

// Versioned writes and delete behind the FHIR base (api/fhir): If-Match conflicts, deleting a
// patient (FHIR delete), and what a read of a deleted patient answers (410 Gone).

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"carehub/kernel/access"
	"carehub/kernel/fault"
)

// VersionConflict is a write whose If-Match named a version the patient is no longer (or not
// yet) at: FHIR's 412 Precondition Failed. Nothing was written.
type VersionConflict struct {
	ID                string
	Current, Expected int
}

func (e *VersionConflict) Error() string {
	return "patient " + e.ID + " is at version " + strconv.Itoa(e.Current) + ", not " + strconv.Itoa(e.Expected) +
		": read it again and apply the change to the current version"
}

// Deletion is a patient's deletion: the version it made and when.
type Deletion struct {
	Version int
	At      time.Time
	// Already: the patient was deleted before this call, which wrote nothing (FHIR's delete is
	// idempotent).
	Already bool
}

// DeletePatient deletes patient id (FHIR delete): its history keeps every version and ends in a
// deletion (a version without a resource); reads of it are then Gone and searches omit it. A
// patient with observations, encounters or risk assessments is not deleted (Conflict, FHIR's
// referential integrity): what refers to it would point at nothing. ifMatch, when not 0, is the
// version the patient must be at (*VersionConflict else), checked under the row lock. A patient
// the caller may not see is NotFound; one deleted before answers Already. Requires
// write:patients.
func (s *Service) DeletePatient(ctx context.Context, id string, ifMatch int) (Deletion, error) {
	p, err := access.Require(ctx, access.WritePatients)
	if err != nil {
		return Deletion{}, err
	}
	var d Deletion
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var orgID string
		var synthetic bool
		err := tx.QueryRow(ctx, `select org_id, synthetic, version_id from patients where `+scope+` and id = $3 for update`,
			p.OrgFilter(), p.SeesRealPatients(), id).Scan(&orgID, &synthetic, &d.Version)
		if errors.Is(err, pgx.ErrNoRows) {
			d, err = deletion(ctx, tx, p, id)
			return err
		}
		if err != nil {
			return err
		}
		if ifMatch != 0 && ifMatch != d.Version {
			return &VersionConflict{ID: id, Current: d.Version, Expected: ifMatch}
		}
		if err := refusedByReferences(ctx, tx, id); err != nil {
			return err
		}
		// The version being deleted stays in the history, also for a patient written before
		// versions were kept.
		if _, err := recordVersion(ctx, tx, id); err != nil {
			return err
		}
		d.Version++
		d.At = time.Now()
		if _, err := tx.Exec(ctx, `insert into patient_versions (patient_id, version_id, resource, updated_at, org_id, synthetic, deleted)
values ($1, $2, null, $3, $4, $5, true)`, id, d.Version, d.At, orgID, synthetic); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `delete from patients where id = $1`, id)
		return err
	})
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok && pe.Code == "23503" {
		// Clinical data arrived between the check and the delete (the keys hold it).
		return Deletion{}, fault.Conflict("patient %s has clinical data that refers to it: it is not deleted", id)
	}
	if err != nil {
		if _, ok := errors.AsType[*VersionConflict](err); ok || fault.As(err) != nil {
			return Deletion{}, err
		}
		return Deletion{}, fmt.Errorf("delete patient %s: %w", id, err)
	}
	access.Touch(ctx, access.KindPatient, id)
	return d, nil
}

// refusedByReferences is the Conflict of a patient that clinical data refers to.
func refusedByReferences(ctx context.Context, tx pgx.Tx, id string) error {
	var obs, enc, rep bool
	err := tx.QueryRow(ctx, `select exists(select 1 from observations where patient_id = $1),
	exists(select 1 from encounters where patient_id = $1) or exists(select 1 from fhir_resources where patient_id = $1),
	exists(select 1 from reports where patient_id = $1)`, id).Scan(&obs, &enc, &rep)
	if err != nil {
		return err
	}
	if obs || enc || rep {
		return fault.Conflict("patient %s is referred to by its observations, encounters or risk assessments: carehub keeps "+
			"referential integrity and does not delete it (nor them with it)", id)
	}
	return nil
}

// deletion is the Deletion of a patient already deleted and visible to p, NotFound when there
// is none.
func deletion(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, p *access.Principal, id string) (Deletion, error) {
	d := Deletion{Already: true}
	err := q.QueryRow(ctx, `select version_id, updated_at from patient_versions where `+scope+` and patient_id = $3 and deleted
order by version_id desc limit 1`, p.OrgFilter(), p.SeesRealPatients(), id).Scan(&d.Version, &d.At)
	if errors.Is(err, pgx.ErrNoRows) {
		return Deletion{}, fault.NotFound("patient", id)
	}
	if err != nil {
		return Deletion{}, fmt.Errorf("patient %s: %w", id, err)
	}
	return d, nil
}

// PatientDeleted returns the deletion of patient id when the caller may see the patient and it
// is deleted: a read then answers 410 Gone rather than 404. NotFound otherwise. Requires
// read:patients or write:patients (a write of a deleted patient is Gone too).
func (s *Service) PatientDeleted(ctx context.Context, id string) (Deletion, error) {
	p := access.From(ctx)
	if p == nil || !p.Has(access.ReadPatients) && !p.Has(access.WritePatients) {
		return Deletion{}, fault.NotFound("patient", id)
	}
	return deletion(ctx, s.pool, p, id)
}
