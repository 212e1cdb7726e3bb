package patients

// FHIR delete of the generic store's resources.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/fault"
	"carehub/kernel/ids"
)

// DeleteResource deletes t/id (FHIR delete): a new version without a resource ends its history,
// and reads, searches, conditional matches and reference checks no longer see it (a later update
// under its id makes it anew, its history kept). It is refused (Conflict) while another stored
// resource, or for an Encounter one of its patient's Observations, refers to it: the store
// keeps references whole. ifMatch as UpdateResource. Deleting a deleted resource writes nothing
// and answers its deletion. Requires write:patients.
func (s *Service) DeleteResource(ctx context.Context, t, id string, ifMatch int) (Deletion, error) {
	w, err := requireWriter(ctx)
	if err != nil {
		return Deletion{}, err
	}
	var d Deletion
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var version int
		var deleted, synthetic bool
		var patientID string
		var updated time.Time
		err := tx.QueryRow(ctx, `select version_id, deleted, synthetic, coalesce(patient_id, ''), last_updated from fhir_resources
where org_id = $1 and type = $2 and id = $3 for update`, w.orgID, t, id).Scan(&version, &deleted, &synthetic, &patientID, &updated)
		switch {
		case errors.Is(err, pgx.ErrNoRows) || err == nil && !synthetic && !w.p.SeesRealPatients():
			return s.notDeletable(ctx, tx, w, t, id)
		case err != nil:
			return err
		case deleted:
			d = Deletion{Version: version, At: updated, Already: true}
			return nil
		case ifMatch != 0 && ifMatch != version:
			return &VersionConflict{ID: id, Current: version, Expected: ifMatch}
		}
		if err := referredTo(ctx, tx, w, t, id, patientID); err != nil {
			return err
		}
		d = Deletion{Version: version + 1, At: time.Now()}
		if _, err := tx.Exec(ctx, `update fhir_resources set deleted = true, version_id = $4, last_updated = $5
where org_id = $1 and type = $2 and id = $3`, w.orgID, t, id, d.Version, d.At); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `insert into fhir_resource_versions (org_id, type, id, version_id, resource, last_updated, deleted)
values ($1, $2, $3, $4, null, $5, true)`, w.orgID, t, id, d.Version, d.At)
		touch(ctx, t, id, patientID)
		return err
	})
	if err != nil {
		return Deletion{}, wrapWrite(t, err)
	}
	return d, nil
}

// notDeletable is the refusal of a delete of nothing the writer can see: NotFound, or Conflict
// for an Encounter of the typed table, which carehub's integrations own.
func (s *Service) notDeletable(ctx context.Context, tx pgx.Tx, w writer, t, id string) error {
	if t == "Encounter" {
		var typed bool
		if err := tx.QueryRow(ctx, `select exists(select 1 from fhir_typed_encounters where id = $1 and org_id = $2 and ($3 or synthetic))`,
			id, w.orgID, w.p.SeesRealPatients()).Scan(&typed); err != nil {
			return err
		}
		if typed {
			return fault.Conflict("Encounter/%s is written by carehub's integrations and is read-only here", ids.FHIR(id))
		}
	}
	return fault.NotFound(t, ids.FHIR(id))
}

// referredTo is the Conflict of a resource that a stored resource refers to.
func referredTo(ctx context.Context, tx pgx.Tx, w writer, t, id, patientID string) error {
	ref := t + "/" + id
	var by string
	err := tx.QueryRow(ctx, `select type || '/' || id from fhir_resources where org_id = $1 and refs @> array[$2] and not deleted
and not (type = $3 and id = $4) limit 1`, w.orgID, ref, t, id).Scan(&by)
	if errors.Is(err, pgx.ErrNoRows) && t == "Encounter" && patientID != "" {
		// An Observation names its encounter in its resource (json), in either id form.
		forms := []string{ref, t + "/" + ids.FHIR(id)}
		for _, f := range forms {
			pattern, _ := json.Marshal(map[string]any{"encounter": map[string]string{"reference": f}})
			err = tx.QueryRow(ctx, `select 'Observation/' || id from observations where patient_id = $1 and resource::jsonb @> $2::jsonb limit 1`,
				patientID, string(pattern)).Scan(&by)
			if !errors.Is(err, pgx.ErrNoRows) {
				break
			}
		}
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("references to %s: %w", ref, err)
	}
	bt, bid, _ := cutRef(by)
	return fault.Conflict("%s/%s is referred to by %s/%s: carehub keeps references whole and does not delete it", t, ids.FHIR(id), bt, ids.FHIR(bid))
}

func cutRef(ref string) (t, id string, ok bool) {
	for i := 0; i < len(ref); i++ {
		if ref[i] == '/' {
			return ref[:i], ref[i+1:], true
		}
	}
	return ref, "", false
}
