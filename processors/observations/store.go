package observations

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/events"
	"carehub/schemas/kafka/observation"
	"carehub/storage"
	"carehub/storage/postgres"
)

// EventType is the type of the event the writer produces for each stored observation.
const EventType = events.TypeDeviceObservationReceived

// ClientIDSystem is the identifier system under which a stored Observation keeps the id its
// client sent (the resource's own id is carehub's obs_ id).
const ClientIDSystem = "urn:carehub:client-id"

// projectTTL bounds how long a resolved device-event project is reused.
const projectTTL = time.Minute

// store writes batches of observations, idempotently by id.
type store struct {
	pool     *pgxpool.Pool
	projects projectCache
}

func newStore(pool *pgxpool.Pool) *store {
	return &store{pool: pool, projects: projectCache{m: map[string]projectEntry{}}}
}

// storeResult says what one batch did.
type storeResult struct {
	present        []observation.Message // in observations after the batch, once per id, in batch order: each gets its event
	stored         []observation.Message // of present, those this batch stored
	duplicates     int                   // already stored (redeliveries, repeated client ids)
	unknownPatient int                   // patient absent from the record's organization: never stored
	// rejected are the messages never stored, which go to the dead-letter topic: those whose
	// values Postgres refused (e.g. \u0000 in a JSON string), with the refusal's words
	// (storage.Refusal), and those of an unknown patient (a patient deleted between the
	// observation's acknowledgement and its storing: acknowledged, so kept for an operator).
	rejected []rejection
}

// unknownPatient is the dead-letter reason of an observation whose patient is not in its
// organization when it is stored.
const unknownPatient = "the patient is not in the observation's organization (deleted after the observation was accepted)"

// rejection is a message of a batch that Postgres refused.
type rejection struct {
	index  int
	reason string
}

const createIncoming = `create temp table if not exists observations_in (
	id text not null, org_id text not null, patient_id text not null, status text not null,
	loinc text, value double precision, unit text, effective_at timestamptz not null,
	device_type text, resource json not null, received_at timestamptz not null
) on commit delete rows`

// insertIncoming moves the temporary rows (storedRow's, like the direct COPY's) into
// observations and returns, for every row that is in observations afterwards, its id and
// whether this statement stored it. A row is stored only when its patient belongs to its
// organization (intake checked; this keeps a stray record from writing across tenants), once
// per id (distinct on, then ON CONFLICT for rows stored earlier or by a concurrent writer).
const insertIncoming = `with storable as (
	select distinct on (t.id) t.* from observations_in t
	join patients p on p.id = t.patient_id and p.org_id = t.org_id
	order by t.id
), ins as (
insert into observations (id, org_id, patient_id, status, loinc, value, unit,
	effective_at, device_type, resource, received_at)
select t.id, t.org_id, t.patient_id, t.status, t.loinc, t.value, t.unit,
	t.effective_at, t.device_type, t.resource, t.received_at
from storable t
order by t.id
on conflict (id) do nothing
returning id
)
select s.id, ins.id is not null from storable s left join ins on ins.id = s.id`

// write stores msgs in one transaction. The common case, a chunk of new observations, is one
// COPY straight into observations (copyNew). When that fails on something a staged insert sorts
// out (an id stored before: a redelivered poll; a value Postgres refuses) the chunk goes through
// the staging table: COPY into a temporary table, then INSERT … ON CONFLICT DO NOTHING. When
// Postgres refuses a value there too (a data exception, SQLSTATE class 22: what a record that
// slipped past intake's checks could carry), it stores the batch again one record at a time and
// skips the refused ones, so one bad record never stalls the partition.
func (s *store) write(ctx context.Context, msgs []observation.Message) (storeResult, error) {
	res, err := s.copyNew(ctx, msgs)
	if err == nil || !stagedInsertSolves(err) {
		return res, err
	}
	res, err = s.writeTx(ctx, msgs, false)
	if err != nil && isDataError(err) {
		return s.writeTx(ctx, msgs, true)
	}
	return res, err
}

// copyNew stores msgs, all new, with one COPY into observations, in one transaction; an id
// stored before fails it with unique_violation. Rows are copied in id order, so two concurrent
// chunks that share an id wait on each other in one order and never deadlock. A repeated id
// is stored once; a patient that is not its organization's is never stored (the check
// insertIncoming makes by joining patients, made here by one lookup per chunk).
func (s *store) copyNew(ctx context.Context, msgs []observation.Message) (storeResult, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return storeResult{}, fmt.Errorf("store observations: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	orgOf, err := patientOrgs(ctx, tx, msgs)
	if err != nil {
		return storeResult{}, err
	}
	res := storeResult{present: make([]observation.Message, 0, len(msgs))}
	seen := make(map[string]bool, len(msgs))
	for i := range msgs {
		switch m := &msgs[i]; {
		case orgOf[m.PatientID] != m.OrgID:
			res.unknownPatient++
			res.rejected = append(res.rejected, rejection{index: i, reason: unknownPatient})
		case seen[m.ID]:
			res.duplicates++
		default:
			seen[m.ID] = true
			res.present = append(res.present, *m)
		}
	}
	res.stored = res.present
	order := make([]int, len(res.present))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(res.present[a].ID, res.present[b].ID) })
	if _, err := storedRows(res.present, order).Copy(ctx, tx.Conn().PgConn(), "observations", storedColumns); err != nil {
		return storeResult{}, fmt.Errorf("store observations: copy: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return storeResult{}, fmt.Errorf("store observations: commit: %w", err)
	}
	return res, nil
}

// patientOrgs returns the organization of each patient of msgs that exists, and locks those
// patients (for key share, as a foreign key would) until tx ends: a patient deleted meanwhile is
// deleted before the lock (and not found) or after tx commits (and the delete fails on the
// observations, schemas/postgres/0022).
func patientOrgs(ctx context.Context, tx pgx.Tx, msgs []observation.Message) (map[string]string, error) {
	ids := make([]string, 0, 64)
	seen := make(map[string]bool, 64)
	for i := range msgs {
		if p := msgs[i].PatientID; !seen[p] {
			seen[p] = true
			ids = append(ids, p)
		}
	}
	rows, _ := tx.Query(ctx, `select id, org_id from patients where id = any($1) for key share`, ids)
	out := make(map[string]string, len(ids))
	var id, org string
	if _, err := pgx.ForEachRow(rows, []any{&id, &org}, func() error {
		out[id] = org
		return nil
	}); err != nil {
		return nil, fmt.Errorf("store observations: patients: %w", err)
	}
	return out, nil
}

// stagedInsertSolves reports whether the staged insert stores what a direct COPY could not: an
// id stored before (unique_violation) or a value Postgres refuses (class 22).
func stagedInsertSolves(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "23505" || isDataError(err)
}

func (s *store) writeTx(ctx context.Context, msgs []observation.Message, oneByOne bool) (storeResult, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return storeResult{}, fmt.Errorf("store observations: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, createIncoming); err != nil {
		return storeResult{}, fmt.Errorf("store observations: %w", err)
	}
	if _, err := patientOrgs(ctx, tx, msgs); err != nil { // the lock; insertIncoming joins patients
		return storeResult{}, err
	}
	var res storeResult
	if !oneByOne {
		if res, err = s.insert(ctx, tx, msgs); err != nil {
			return storeResult{}, err
		}
	} else {
		for i := range msgs {
			one, err := s.insertSavepoint(ctx, tx, msgs[i:i+1])
			if isDataError(err) {
				res.rejected = append(res.rejected, rejection{index: i, reason: storage.Refusal(postgres.Refused(err))})
				continue
			}
			if err != nil {
				return storeResult{}, err
			}
			res.present = append(res.present, one.present...)
			res.stored = append(res.stored, one.stored...)
			res.duplicates += one.duplicates
			res.unknownPatient += one.unknownPatient
			for _, rj := range one.rejected { // of msgs[i:i+1]
				res.rejected = append(res.rejected, rejection{index: i, reason: rj.reason})
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return storeResult{}, fmt.Errorf("store observations: commit: %w", err)
	}
	return res, nil
}

func (s *store) insertSavepoint(ctx context.Context, tx pgx.Tx, msgs []observation.Message) (storeResult, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return storeResult{}, fmt.Errorf("store observations: savepoint: %w", err)
	}
	res, err := s.insert(ctx, sp, msgs)
	if err == nil {
		// The next record is copied into the same temporary table in this transaction.
		_, err = sp.Exec(ctx, `delete from observations_in`)
	}
	if err != nil {
		_ = sp.Rollback(ctx)
		return storeResult{}, err
	}
	if err := sp.Commit(ctx); err != nil {
		return storeResult{}, fmt.Errorf("store observations: release savepoint: %w", err)
	}
	return res, nil
}

// insert copies msgs into the temporary table and moves the new ones into observations.
func (s *store) insert(ctx context.Context, tx pgx.Tx, msgs []observation.Message) (storeResult, error) {
	if _, err := storedRows(msgs, nil).Copy(ctx, tx.Conn().PgConn(), "observations_in", storedColumns); err != nil {
		return storeResult{}, fmt.Errorf("store observations: copy: %w", err)
	}
	qrows, _ := tx.Query(ctx, insertIncoming)
	isNew := make(map[string]bool, len(msgs))
	var id string
	var fresh bool
	_, err := pgx.ForEachRow(qrows, []any{&id, &fresh}, func() error {
		isNew[id] = fresh
		return nil
	})
	if err != nil {
		return storeResult{}, fmt.Errorf("store observations: insert: %w", err)
	}
	res := storeResult{present: make([]observation.Message, 0, len(isNew))}
	seen := make(map[string]bool, len(isNew))
	for i := range msgs {
		fresh, ok := isNew[msgs[i].ID]
		switch {
		case !ok:
			res.unknownPatient++
			res.rejected = append(res.rejected, rejection{index: i, reason: unknownPatient})
		case seen[msgs[i].ID]:
			// A repeated id in the batch: stored once (distinct on), its event produced once.
			res.duplicates++
		case fresh:
			res.stored = append(res.stored, msgs[i])
			res.present = append(res.present, msgs[i])
		default:
			res.duplicates++
			res.present = append(res.present, msgs[i])
		}
		if ok {
			seen[msgs[i].ID] = true
		}
	}
	return res, nil
}

// isDataError reports whether Postgres refused the rows themselves (postgres.Refused: a data
// exception, an integrity constraint, a program limit), as opposed to failing (connection,
// timeout), which is retried. (A unique violation, the one integrity error a retry mends, is
// sorted out by the staged insert before this is asked.)
func isDataError(err error) bool {
	return storage.IsUnstorable(postgres.Refused(err))
}

// projectCache maps organizations to the project their device events are filed under: the
// organization's oldest project (created_at, then id). The event log is per project while
// patients are per organization; the oldest project is stable (projects are not deleted) and
// needs no configuration. An organization without a project files them under "" (like
// marketplace events), so no event is dropped.
type projectCache struct {
	mu sync.Mutex
	m  map[string]projectEntry
}

type projectEntry struct {
	id      string
	expires time.Time
}

func (c *projectCache) resolve(ctx context.Context, pool *pgxpool.Pool, msgs []observation.Message) (map[string]string, error) {
	now := time.Now()
	out := map[string]string{}
	var missing []string
	c.mu.Lock()
	for i := range msgs {
		org := msgs[i].OrgID
		if _, done := out[org]; done {
			continue
		}
		if e, ok := c.m[org]; ok && now.Before(e.expires) {
			out[org] = e.id
			continue
		}
		out[org] = ""
		missing = append(missing, org)
	}
	c.mu.Unlock()
	if len(missing) == 0 {
		return out, nil
	}
	rows, _ := pool.Query(ctx, `select distinct on (org_id) org_id, id from projects where org_id = any($1)
order by org_id, created_at, id`, missing)
	type orgProject struct {
		OrgID string `db:"org_id"`
		ID    string `db:"id"`
	}
	found, err := pgx.CollectRows(rows, pgx.RowToStructByName[orgProject])
	if err != nil {
		return nil, fmt.Errorf("store observations: projects: %w", err)
	}
	for _, f := range found {
		out[f.OrgID] = f.ID
	}
	c.mu.Lock()
	if len(c.m) > 10_000 {
		clear(c.m)
	}
	for _, org := range missing {
		c.m[org] = projectEntry{id: out[org], expires: now.Add(projectTTL)}
	}
	c.mu.Unlock()
	return out, nil
}
