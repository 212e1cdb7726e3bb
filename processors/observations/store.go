package observations

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/processors/events"
	"carehub/storage"
)

// EventType is the type of the event queued for each newly stored observation.
const EventType = events.TypeDeviceObservationReceived

// ClientIDSystem is the identifier system under which a stored Observation keeps the id its
// client sent (the resource's own id is carehub's obs_ id).
const ClientIDSystem = "urn:carehub:client-id"

// projectTTL bounds how long a resolved device-event project is reused.
const projectTTL = time.Minute

// store writes batches of observations and their events.
type store struct {
	pool        *pgxpool.Pool
	eventsTopic string
	emit        bool
	projects    projectCache
}

func newStore(pool *pgxpool.Pool, eventsTopic string, emit bool) *store {
	return &store{pool: pool, eventsTopic: eventsTopic, emit: emit, projects: projectCache{m: map[string]projectEntry{}}}
}

// storeResult says what one batch did.
type storeResult struct {
	stored         []Message // newly stored, in batch order
	duplicates     int       // already stored (redeliveries, repeated client ids)
	unknownPatient int       // patient absent from the record's organization: never stored
	rejected       int       // values Postgres refused (e.g. \u0000 in a JSON string): never stored
}

const createIncoming = `create temp table if not exists observations_in (
	id text not null, org_id text not null, patient_id text not null, status text not null,
	loinc text, value double precision not null, unit text, effective_at timestamptz not null,
	device_type text, client_id text, resource jsonb not null, received_at timestamptz not null
) on commit delete rows`

var incomingColumns = []string{"id", "org_id", "patient_id", "status", "loinc", "value", "unit", "effective_at",
	"device_type", "client_id", "resource", "received_at"}

// insertIncoming moves the temporary rows into observations. A row is stored only when its
// patient belongs to its organization (intake checked; this keeps a stray record from writing
// across tenants), once per id (distinct on, then ON CONFLICT for rows stored earlier or by a
// concurrent writer). The resource gets carehub's id, and the client's id as an identifier.
const insertIncoming = `insert into observations (id, org_id, patient_id, status, code, loinc, subject, value, unit,
	effective_at, device_type, resource, received_at)
select distinct on (t.id) t.id, t.org_id, t.patient_id, t.status,
	coalesce(t.resource->'code', '{}'::jsonb), t.loinc,
	coalesce(t.resource->'subject', jsonb_build_object('reference', 'Patient/' || t.patient_id)),
	t.value, t.unit, t.effective_at, t.device_type,
	case when t.client_id is null then t.resource || jsonb_build_object('id', t.id)
	else t.resource || jsonb_build_object('id', t.id, 'identifier',
		(case when jsonb_typeof(t.resource->'identifier') = 'array' then t.resource->'identifier' else '[]'::jsonb end)
		|| jsonb_build_array(jsonb_build_object('system', $1::text, 'value', t.client_id)))
	end,
	t.received_at
from observations_in t
join patients p on p.id = t.patient_id and p.org_id = t.org_id
order by t.id
on conflict (id) do nothing
returning id`

const countUnknownPatients = `select count(*) from observations_in t
where not exists (select 1 from patients p where p.id = t.patient_id and p.org_id = t.org_id)`

// write stores msgs in one transaction with their events. When Postgres refuses a value
// (a data exception, SQLSTATE class 22: what a record that slipped past intake's checks could
// carry), it stores the batch again one record at a time and skips the refused ones, so one
// bad record never stalls the partition.
func (s *store) write(ctx context.Context, msgs []Message) (storeResult, error) {
	var projects map[string]string
	if s.emit {
		var err error
		if projects, err = s.projects.resolve(ctx, s.pool, msgs); err != nil {
			return storeResult{}, err
		}
	}
	res, err := s.writeTx(ctx, msgs, projects, false)
	if err != nil && isDataError(err) {
		return s.writeTx(ctx, msgs, projects, true)
	}
	return res, err
}

func (s *store) writeTx(ctx context.Context, msgs []Message, projects map[string]string, oneByOne bool) (storeResult, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return storeResult{}, fmt.Errorf("store observations: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, createIncoming); err != nil {
		return storeResult{}, fmt.Errorf("store observations: %w", err)
	}
	var res storeResult
	if !oneByOne {
		if res, err = s.insert(ctx, tx, msgs, projects); err != nil {
			return storeResult{}, err
		}
	} else {
		for i := range msgs {
			one, err := s.insertSavepoint(ctx, tx, msgs[i:i+1], projects)
			if isDataError(err) {
				res.rejected++
				continue
			}
			if err != nil {
				return storeResult{}, err
			}
			res.stored = append(res.stored, one.stored...)
			res.duplicates += one.duplicates
			res.unknownPatient += one.unknownPatient
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return storeResult{}, fmt.Errorf("store observations: commit: %w", err)
	}
	return res, nil
}

func (s *store) insertSavepoint(ctx context.Context, tx pgx.Tx, msgs []Message, projects map[string]string) (storeResult, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return storeResult{}, fmt.Errorf("store observations: savepoint: %w", err)
	}
	res, err := s.insert(ctx, sp, msgs, projects)
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

// insert copies msgs into the temporary table, moves the new ones into observations, queues
// their events and empties the temporary table again.
func (s *store) insert(ctx context.Context, tx pgx.Tx, msgs []Message, projects map[string]string) (storeResult, error) {
	rows := make([][]any, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		rows[i] = []any{m.ID, m.OrgID, m.PatientID, m.Status, nullable(m.LOINC), m.Value, nullable(m.Unit),
			m.EffectiveAt, nullable(m.DeviceType), nullable(m.ClientID), []byte(m.Observation), m.ReceivedAt}
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"observations_in"}, incomingColumns, pgx.CopyFromRows(rows)); err != nil {
		return storeResult{}, fmt.Errorf("store observations: copy: %w", err)
	}
	qrows, _ := tx.Query(ctx, insertIncoming, ClientIDSystem)
	newIDs, err := pgx.CollectRows(qrows, pgx.RowTo[string])
	if err != nil {
		return storeResult{}, fmt.Errorf("store observations: insert: %w", err)
	}
	res := storeResult{}
	if len(newIDs) < len(msgs) {
		var unknown int
		if err := tx.QueryRow(ctx, countUnknownPatients).Scan(&unknown); err != nil {
			return storeResult{}, fmt.Errorf("store observations: %w", err)
		}
		res.unknownPatient = unknown
		res.duplicates = len(msgs) - len(newIDs) - unknown
	}
	if len(newIDs) > 0 {
		isNew := make(map[string]bool, len(newIDs))
		for _, id := range newIDs {
			isNew[id] = true
		}
		res.stored = make([]Message, 0, len(newIDs))
		for i := range msgs {
			// distinct on stored each id once; report it once.
			if isNew[msgs[i].ID] {
				res.stored = append(res.stored, msgs[i])
				delete(isNew, msgs[i].ID)
			}
		}
	}
	if s.emit && len(res.stored) > 0 {
		evs, err := receivedEvents(res.stored, projects)
		if err != nil {
			return storeResult{}, err
		}
		if err := events.Append(ctx, tx, s.eventsTopic, evs...); err != nil {
			return storeResult{}, fmt.Errorf("store observations: %w", err)
		}
	}
	return res, nil
}

// receivedPayload is the payload of device.observation_received (DECISIONS §4).
type receivedPayload struct {
	ObservationID string  `json:"observationId"`
	PatientID     string  `json:"patientId"`
	Code          string  `json:"code"`
	DeviceType    string  `json:"deviceType,omitempty"`
	Value         float64 `json:"value"`
	Unit          string  `json:"unit,omitempty"`
	EffectiveAt   string  `json:"effectiveAt"`
}

// receivedEvents builds the events of newly stored observations, with ids derived from the
// observation ids (EventID).
func receivedEvents(stored []Message, projects map[string]string) ([]storage.Event, error) {
	now := events.Now()
	evs := make([]storage.Event, len(stored))
	for i := range stored {
		m := &stored[i]
		payload, err := json.Marshal(receivedPayload{
			ObservationID: m.ID, PatientID: m.PatientID, Code: m.Code, DeviceType: m.DeviceType,
			Value: m.Value, Unit: m.Unit, EffectiveAt: m.EffectiveAt.UTC().Format(time.RFC3339Nano),
		})
		if err != nil {
			return nil, fmt.Errorf("store observations: event payload: %w", err)
		}
		evs[i] = storage.Event{
			ID: EventID(m.ID), Type: EventType, OrgID: m.OrgID, ProjectID: projects[m.OrgID],
			Source: events.SourceIntegration, Severity: events.SeverityInfo, Payload: payload, CreatedAt: now,
		}
	}
	return evs, nil
}

// isDataError reports whether Postgres refused a value (SQLSTATE class 22, data exception),
// as opposed to failing (connection, timeout), which is retried.
func isDataError(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && strings.HasPrefix(pg.Code, "22")
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
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

func (c *projectCache) resolve(ctx context.Context, pool *pgxpool.Pool, msgs []Message) (map[string]string, error) {
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
