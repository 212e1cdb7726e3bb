package patients

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/klauspost/compress/s2"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/fhirjson"
	"carehub/kernel/ids"
)

// ExportRunnerConfig configures an ExportRunner.
type ExportRunnerConfig struct {
	// Credential returns the principal key id grants now, or an error when it no longer
	// authenticates (revoked, expired): an export runs only while its requester's key does.
	Credential func(ctx context.Context, keyID string) (*access.Principal, error)
	Logger     *slog.Logger
	// PartResources and PartBytes bound one file of an export, and what the runner holds in
	// memory: DefaultExportPartResources and DefaultExportPartBytes.
	PartResources int
	PartBytes     int
	// Retention is how long a completed export's files are kept: DefaultExportRetention.
	Retention time.Duration
	// Poll is how often an idle runner looks for work: 250 ms by default (one indexed query; a
	// kick-off waits for it before its first part).
	Poll time.Duration
}

// ExportRunner writes the files of pending exports. Several may run (one per processors node):
// each job is leased to one at a time, and a part and the job's position are written in one
// transaction, so a runner that dies mid-job leaves it where its last part ended, for the next.
type ExportRunner struct {
	s   *Service
	cfg ExportRunnerConfig
}

// Defaults of ExportRunnerConfig (docs/LIMITS.md).
const (
	DefaultExportPartResources = 10_000
	DefaultExportPartBytes     = 16 << 20
	DefaultExportRetention     = 24 * time.Hour
)

// exportLease is how long a job is a runner's without a renewal: the runner renews it every
// third of it while it runs, and a job whose runner died is taken up by another once it lapses.
// Every write of a runner names its lease (lease_token), so one that lost its lease (a pause
// longer than it) writes nothing more of the job.
const exportLease = 15 * time.Second

// typedTables are the types SearchType reads from tables of their own, not the generic store.
var typedTables = map[string]bool{"Patient": true, "Observation": true, "RiskAssessment": true}

// ExportRunner returns a runner of s's exports.
func (s *Service) ExportRunner(cfg ExportRunnerConfig) *ExportRunner {
	if cfg.PartResources <= 0 {
		cfg.PartResources = DefaultExportPartResources
	}
	if cfg.PartBytes <= 0 {
		cfg.PartBytes = DefaultExportPartBytes
	}
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultExportRetention
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 250 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &ExportRunner{s: s, cfg: cfg}
}

// Run runs exports until ctx ends, and deletes those past their retention.
func (r *ExportRunner) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Poll)
	defer t.Stop()
	var purged time.Time
	for {
		// Expiry is counted in hours: a purge a minute is plenty, not one a poll.
		if time.Since(purged) >= time.Minute {
			if _, err := r.s.pool.Exec(ctx, `delete from bulk_exports where expires_at < now()`); err != nil && ctx.Err() == nil {
				r.cfg.Logger.Warn("bulk export purge failed", "err", err)
			}
			purged = time.Now()
		}
		for ctx.Err() == nil {
			ran, err := r.RunOne(ctx)
			if err != nil && ctx.Err() == nil {
				r.cfg.Logger.Warn("bulk export failed", "err", err)
			}
			if !ran {
				break
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// exportJob is a leased job.
type exportJob struct {
	id, keyID, level string
	token            string // this runner's lease of the job
	scopes           []string
	patients         []string
	types            []string
	filters          map[string]Search
	since            *time.Time
	txTime           time.Time
	position         exportPosition
}

// exportPosition is where a job stands: every type before Type is written whole, Type stands at
// After (the keyset position of its last part), and the types after it that a lane began stand
// in Ahead. Past the last type, Type and After are the deleted files' (a _since export's).
type exportPosition struct {
	Type  int                  `json:"type"`
	After []*string            `json:"after,omitempty"`
	Ahead map[int]typePosition `json:"ahead,omitempty"`
}

// typePosition is where a type after exportPosition.Type stands: at After, or written whole.
type typePosition struct {
	After []*string `json:"after,omitempty"`
	Done  bool      `json:"done,omitempty"`
}

// of returns where type k stands, and whether it is written whole.
func (p exportPosition) of(k int) ([]*string, bool) {
	switch {
	case k < p.Type:
		return nil, true
	case k == p.Type:
		return p.After, false
	}
	return p.Ahead[k].After, p.Ahead[k].Done
}

// moved returns p with type k at after, or written whole when done: a type that Type reaches
// written whole moves Type past it.
func (p exportPosition) moved(k int, after []*string, done bool) exportPosition {
	ahead := maps.Clone(p.Ahead)
	if k == p.Type {
		p.After = after
	} else {
		if ahead == nil {
			ahead = map[int]typePosition{}
		}
		ahead[k] = typePosition{After: after, Done: done}
	}
	if k == p.Type && done {
		p.Type, p.After = p.Type+1, nil
		for {
			t, ok := ahead[p.Type]
			if !ok {
				break
			}
			delete(ahead, p.Type)
			if !t.Done {
				p.After = t.After
				break
			}
			p.Type++
		}
	}
	if len(ahead) == 0 {
		ahead = nil
	}
	p.Ahead = ahead
	return p
}

// Written counts the types written whole.
func (p exportPosition) Written() int {
	n := p.Type
	for _, t := range p.Ahead {
		if t.Done {
			n++
		}
	}
	return n
}

// RunOne leases one pending export and writes it to the end, or until it is cancelled or ctx
// ends. It reports whether there was one.
func (r *ExportRunner) RunOne(ctx context.Context) (bool, error) {
	j := exportJob{token: rand.Text()}
	var written int64
	err := r.s.pool.QueryRow(ctx, `update bulk_exports set lease_until = now() + $1::interval, lease_token = $2
		where id = (select id from bulk_exports where status = 'in-progress' and (lease_until is null or lease_until < now())
			order by created_at limit 1 for update skip locked)
		returning id, key_id, level, scopes, coalesce(patients, '{}'), types, filters, since, transaction_time, position, written`,
		exportLease.String(), j.token).Scan(&j.id, &j.keyID, &j.level, &j.scopes, &j.patients, &j.types, &j.filters, &j.since, &j.txTime, &j.position, &written)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("lease export: %w", err)
	}
	lost, err := r.s.filesLost(ctx, j.id, written)
	if err != nil {
		return true, err
	}
	if lost { // the unlogged table lost files the job counts (bulk_lost.go): from the start
		if ok, err := r.s.restartExport(ctx, j.id, `lease_token = $2`, j.token); err != nil || !ok {
			return true, err
		}
		j.position = exportPosition{}
	}
	if err := r.run(ctx, &j); err != nil {
		if ctx.Err() != nil || errors.Is(err, errExportGone) {
			return true, nil
		}
		// A refusal is the job's end (its key revoked, a search the stores refuse); anything else
		// is retried when the lease runs out.
		if f := fault.As(err); f != nil {
			_, uerr := r.s.pool.Exec(ctx, `update bulk_exports set status = 'failed', error = $2, completed_at = now(),
				expires_at = now() + $3::interval where id = $1 and lease_token = $4`, j.id, f.Message, r.cfg.Retention.String(), j.token)
			return true, errors.Join(err, uerr)
		}
		return true, fmt.Errorf("export %s: %w", j.id, err)
	}
	return true, nil
}

// errExportGone is a job cancelled while it ran, or whose lease another runner holds now.
var errExportGone = errors.New("export cancelled or its lease lost")

func (r *ExportRunner) run(ctx context.Context, j *exportJob) error {
	leased, cancel := context.WithCancelCause(ctx)
	ctx = leased
	var renewing sync.WaitGroup
	renewing.Go(func() { r.renew(leased, j, cancel) })
	defer renewing.Wait()
	defer cancel(nil)
	p, err := r.cfg.Credential(ctx, j.keyID)
	if err != nil {
		return err
	}
	// The scopes the kick-off had (a token's may be narrower than its key's), as far as the key
	// still grants them.
	granted := p.Scopes
	p.Scopes = nil
	for _, s := range j.scopes {
		if slices.Contains(granted, s) {
			p.Scopes = append(p.Scopes, s)
		}
	}
	ctx = access.With(ctx, p)
	if err := r.exportTypes(ctx, j); err != nil {
		return err
	}
	// A _since export ends with what was deleted since: the Bulk Data IG's deleted files, so that
	// a client keeping a copy in step removes what is gone.
	for j.since != nil && j.position.Type == len(j.types) {
		part, err := r.deletedPart(ctx, j)
		if err != nil {
			return err
		}
		next := exportPosition{Type: len(j.types), After: part.after}
		if part.after == nil {
			next = exportPosition{Type: len(j.types) + 1}
		}
		if err := r.commitPart(ctx, j, DeletedFile, part, part.encode(), next); err != nil {
			return err
		}
		j.position = next
	}
	tag, err := r.s.pool.Exec(ctx, `update bulk_exports set status = 'completed', completed_at = now(), lease_until = null,
		expires_at = now() + $2::interval where id = $1 and status = 'in-progress' and lease_token = $3`, j.id, r.cfg.Retention.String(), j.token)
	if err != nil {
		return fmt.Errorf("complete export: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errExportGone
	}
	return nil
}

// renew renews j's lease every third of exportLease until ctx ends. A job cancelled, or leased by
// another runner since (this one paused past its lease), ends the run (cancel, errExportGone); a
// renewal the database did not answer is tried again, and if the lease lapses meanwhile the
// run's next write finds it lost.
func (r *ExportRunner) renew(ctx context.Context, j *exportJob, cancel context.CancelCauseFunc) {
	t := time.NewTicker(exportLease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		tag, err := r.s.pool.Exec(ctx, `update bulk_exports set lease_until = now() + $2::interval
			where id = $1 and status = 'in-progress' and lease_token = $3`, j.id, exportLease.String(), j.token)
		switch {
		case err != nil && ctx.Err() == nil:
			r.cfg.Logger.Warn("bulk export lease renewal failed", "export", j.id, "err", err)
		case err == nil && tag.RowsAffected() == 0:
			cancel(errExportGone)
			return
		}
	}
}

// exportPart is one file's worth of a type: its NDJSON, in FHIR form, and where the next part
// starts (nil at the type's end).
type exportPart struct {
	ndjson   bytes.Buffer
	s2       []byte // ndjson as stored (encode)
	count    int
	patients []string
	after    []*string
}

// encode puts p's NDJSON in the form it is stored in, S2's block format (schemas/postgres
// 0044), into p's own buffer, reused as ndjson's is.
func (p *exportPart) encode() []byte {
	p.s2 = s2.Encode(p.s2, p.ndjson.Bytes())
	return p.s2
}

// reset empties p for the next part, keeping its room: a lane's parts are written into one
// buffer, grown once to a part's size, rather than each into a new one grown by doubling.
func (p *exportPart) reset() {
	p.ndjson.Reset()
	p.count, p.patients = 0, p.patients[:0]
}

// exportLanes is how many types a runner writes at once: an export is two streams, each a
// query on a Postgres backend of its own and a goroutine putting its rows in FHIR form, so a
// large export uses two cores (the Observations beside every other type, in a Synthea
// population, are about half and half).
const exportLanes = 2

// exportTypes writes every type of the job not yet written whole, exportLanes at a time, each
// from where it stands. Parts are committed one at a time (commitPart under a lock), each with
// the job's whole position, so a runner killed at any point leaves every type where its last
// part ended.
func (r *ExportRunner) exportTypes(ctx context.Context, j *exportJob) error {
	var pending []int // read before the lanes start: from then on they move j.position
	for k := range j.types {
		if _, done := j.position.of(k); !done {
			pending = append(pending, k)
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var mu sync.Mutex // j.position and the commits
	work := make(chan int)
	var wg sync.WaitGroup
	for range exportLanes {
		wg.Go(func() {
			part := &exportPart{}
			for k := range work {
				if err := r.exportType(ctx, j, k, &mu, part); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	for _, k := range pending {
		select {
		case work <- k:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return nil
}

// exportType writes type k of the job from where it stands to its end: one search streams every
// match, in its primary key's order, and a part is committed, with the position of its last
// resource, each time it is full, so a lane holds one part in memory whatever the type's size.
func (r *ExportRunner) exportType(ctx context.Context, j *exportJob, k int, mu *sync.Mutex, part *exportPart) error {
	t := j.types[k]
	commit := func(part *exportPart, after []*string, done bool) error {
		stored := part.encode() // before the lock: the lanes compress at once
		mu.Lock()
		defer mu.Unlock()
		next := j.position.moved(k, after, done)
		if err := r.commitPart(ctx, j, t, part, stored, next); err != nil {
			return err
		}
		j.position = next
		return nil
	}
	// A Group whose members are all inactive, or none of the patients asked for, exports
	// nobody: an empty list would be no restriction at all to the search.
	restricted := j.level == ExportGroup || len(j.patients) > 0
	if restricted && len(j.patients) == 0 {
		return commit(&exportPart{}, nil, true)
	}
	mu.Lock()
	from, _ := j.position.of(k)
	mu.Unlock()
	q := j.filters[t]
	q.After, q.NoTotal = from, true
	q.LastUpdated = append(q.LastUpdated, DateBound{Prefix: "lt", From: j.txTime})
	if j.since != nil {
		q.LastUpdated = append(q.LastUpdated, DateBound{Prefix: "ge", From: *j.since})
	}
	if restricted {
		if t == "Patient" {
			q.IDs = j.patients
		} else {
			q.Patients = j.patients
		}
	}
	// In the primary key's order, which its index gives (a search's own default, an
	// Observation's date, newest first, would be sorted whole); the generic store's default
	// order is its key's already.
	if typedTables[t] {
		q.Sort = []SortKey{{Param: "_id"}}
	}
	part.reset()
	seen := map[string]bool{}
	q.Each = func(doc json.RawMessage, patientID string, position func() []*string) error {
		line, err := fhirjson.AppendRewriteValid(part.ndjson.AvailableBuffer(), doc)
		if err != nil {
			return fmt.Errorf("export %s: a stored %s is not JSON: %w", j.id, t, err)
		}
		part.ndjson.Write(append(line, '\n'))
		part.count++
		if patientID != "" && !seen[patientID] {
			seen[patientID] = true
			part.patients = append(part.patients, patientID)
		}
		if part.count < r.cfg.PartResources && part.ndjson.Len() < r.cfg.PartBytes {
			return nil
		}
		if err := commit(part, position(), false); err != nil {
			return err
		}
		part.reset()
		clear(seen)
		return nil
	}
	if _, err := r.s.SearchType(ctx, t, q); err != nil {
		return err
	}
	return commit(part, nil, true)
}

// DeletedFile is the file type of a _since export's deleted resources: each line a transaction
// Bundle of one DELETE entry (the manifest's deleted array lists these files as type Bundle).
const DeletedFile = "deleted"

// deletedPart reads the job's resources deleted in [_since, transactionTime) from its position:
// the generic store's deleted resources and the patients deleted (their tombstone versions), of
// the types the job exports, as the requester may see them (organization, test mode) and, for a
// Patient or Group export, of its patients only.
func (r *ExportRunner) deletedPart(ctx context.Context, j *exportJob) (*exportPart, error) {
	p := access.From(ctx)
	restricted := j.level == ExportGroup || len(j.patients) > 0
	afterType, afterID := "", ""
	if len(j.position.After) == 2 && j.position.After[0] != nil && j.position.After[1] != nil {
		afterType, afterID = *j.position.After[0], *j.position.After[1]
	}
	var patients []string
	if restricted {
		patients = nonNilStrings(j.patients)
	}
	rows, err := r.s.pool.Query(ctx, `select type, id, coalesce(patient_id, '') from (
	select type, id, patient_id from fhir_resources
	where ($1 = '' or org_id = $1) and deleted and last_updated >= $2 and last_updated < $3 and ($4 or synthetic) and type = any($5)
	union all
	select 'Patient', v.patient_id, v.patient_id from patient_versions v
	where ($1 = '' or v.org_id = $1) and v.deleted and v.updated_at >= $2 and v.updated_at < $3 and ($4 or v.synthetic) and 'Patient' = any($5)
) d
where ($6::text[] is null or patient_id = any($6)) and (type, id) > ($7, $8)
order by type, id limit $9`, p.OrgFilter(), *j.since, j.txTime, p.SeesRealPatients(), j.types, patients, afterType, afterID, r.cfg.PartResources)
	if err != nil {
		return nil, fmt.Errorf("deleted resources: %w", err)
	}
	part := &exportPart{}
	var last [2]string
	var pid string
	seen := map[string]bool{}
	_, err = pgx.ForEachRow(rows, []any{&last[0], &last[1], &pid}, func() error {
		if pid != "" && !seen[pid] { // the download's audit record names them, as other files'
			seen[pid] = true
			part.patients = append(part.patients, pid)
		}
		line, err := json.Marshal(map[string]any{"resourceType": "Bundle", "type": "transaction", "entry": []any{
			map[string]any{"request": map[string]string{"method": "DELETE", "url": last[0] + "/" + ids.FHIR(last[1])}}}})
		if err != nil {
			return err
		}
		part.ndjson.Write(line)
		part.ndjson.WriteByte('\n')
		part.count++
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("deleted resources: %w", err)
	}
	if part.count == r.cfg.PartResources {
		t, id := last[0], last[1]
		part.after = []*string{&t, &id}
	}
	return part, nil
}

// commitPart writes a part (if it holds anything), stored as part.encode() returned it, and the
// job's next position in one transaction, and renews the lease; errExportGone when the job was
// cancelled meanwhile.
func (r *ExportRunner) commitPart(ctx context.Context, j *exportJob, t string, part *exportPart, stored []byte, next exportPosition) error {
	return pgx.BeginFunc(ctx, r.s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `update bulk_exports set position = $2, written = written + $3, lease_until = now() + $4::interval
			where id = $1 and status = 'in-progress' and lease_token = $5`, j.id, next, part.count, exportLease.String(), j.token)
		if err != nil {
			return fmt.Errorf("export position: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return errExportGone
		}
		if part.count == 0 {
			return nil
		}
		_, err = tx.Exec(ctx, `insert into bulk_export_files (export_id, type, part, count, patient_ids, ndjson, fhir_form, coding)
			values ($1, $2, (select coalesce(max(part), 0) + 1 from bulk_export_files where export_id = $1 and type = $2), $3, $4, $5, true, 's2')`,
			j.id, t, part.count, nonNilStrings(part.patients), stored)
		if err != nil {
			return fmt.Errorf("export part: %w", err)
		}
		return nil
	})
}
