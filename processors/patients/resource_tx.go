package patients

// FHIR transactions over Patients and the generic store: one Postgres transaction, with every
// urn:uuid fullUrl and every conditional reference resolved to the resource it names in every
// reference of every entry. Observations are not written here (they go through intake and
// Kafka): the transaction gives each its final body, references resolved, and the id intake will
// derive for it, so that the other entries can name it.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
)

// TxEntry is one entry of a transaction: a create of Type (Patient, Observation or a generic
// type) from Body (without the server's elements), conditional when IfNoneExist is set.
type TxEntry struct {
	FullURL     string
	Type        string
	Body        []byte
	IfNoneExist *Identifier
	// Existing is the resource a conditional create by other parameters than one identifier
	// matched, found by the caller's search before the transaction: the entry names it and
	// writes nothing.
	Existing string
}

// TxResult is what became of an entry: the stored resource (Doc; nil for an Observation), its
// carehub ID, and whether it was created (false: a conditional create matched ID). For an
// Observation, Body is what to send to intake: references resolved and, when other entries may
// name it, the client id from which intake derives ID.
type TxResult struct {
	Doc     json.RawMessage
	ID      string
	Created bool
	Body    []byte
}

// TxUndo names what a transaction created, for RemoveTransaction.
type TxUndo struct {
	patients  []string
	resources []string // Type/id
}

// EntryErrors refuses a transaction: the error of each refused entry, by index. Nothing of the
// transaction was written.
type EntryErrors map[int]error

func (e EntryErrors) Error() string {
	return "transaction refused: " + strconv.Itoa(len(e)) + " entries; nothing of it was stored"
}

// ObservationIDFunc is the id intake gives an observation sent with a client id
// (intake.ClientObservationID).
type ObservationIDFunc func(orgID, clientID string, body []byte) string

// txState is a transaction being planned.
type txState struct {
	entries []TxEntry
	docs    []resourceDoc
	res     []TxResult
	bad     EntryErrors
	urls    map[string]string        // fullUrl → Type/id
	local   map[string]*patientScope // Type/id of entries created here → scope
	cond    conditionals             // conditional references: the entries' identifiers, and matches in the store
	obsDeps map[int]map[string]bool  // Observation entry → fullUrls of Observations it names
	xs      []extracted              // each entry's search values, once its references are resolved (resolveAll)
}

// WriteTransaction writes the Patients and generic resources of entries in one Postgres
// transaction, all or none; check validates each Observation's final body (intake's checks)
// before the commit, and an entry it refuses refuses the transaction. The caller then submits the
// Observations; should that fail, RemoveTransaction undoes what was written. Requires
// write:patients.
func (s *Service) WriteTransaction(ctx context.Context, entries []TxEntry, obsID ObservationIDFunc, check func(i int, body []byte) error) ([]TxResult, *TxUndo, error) {
	w, err := requireWriter(ctx)
	if err != nil {
		return nil, nil, err
	}
	st := &txState{entries: entries, docs: make([]resourceDoc, len(entries)), res: make([]TxResult, len(entries)), xs: make([]extracted, len(entries)),
		bad: EntryErrors{}, urls: map[string]string{}, local: map[string]*patientScope{},
		obsDeps: map[int]map[string]bool{}}
	st.cond = conditionals{pending: map[string]map[string][]string{}, matched: map[string]string{}, urls: st.urls}
	for i, e := range entries {
		if st.docs[i], err = parseResource(e.Type, e.Body); err != nil {
			st.bad[i] = err
		}
	}
	if len(st.bad) > 0 {
		return nil, nil, st.bad
	}
	undo := &TxUndo{}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := st.assign(ctx, tx, w); err != nil {
			return err
		}
		if err := st.resolveObservations(ctx, s, tx, w, obsID); err != nil {
			return err
		}
		if err := st.resolveAll(ctx, s, tx, w); err != nil {
			return err
		}
		if len(st.bad) > 0 {
			return st.bad
		}
		if err := st.write(ctx, s, tx, w, undo, check); err != nil {
			return err
		}
		if len(st.bad) > 0 {
			return st.bad
		}
		return nil
	})
	if len(st.bad) > 0 {
		return nil, nil, st.bad
	}
	if err != nil {
		return nil, nil, wrapWrite("transaction", err)
	}
	return st.res, undo, nil
}

// assign gives every Patient and generic entry its id: an existing resource's when its
// conditional create matches, else a new one; and records how other entries name it.
func (st *txState) assign(ctx context.Context, tx pgx.Tx, w writer) error {
	if err := st.lockConditions(ctx, tx, w); err != nil {
		return err
	}
	for i, e := range st.entries {
		if e.Type == "Observation" {
			continue
		}
		if e.Existing != "" {
			st.res[i] = TxResult{ID: e.Existing}
			st.name(i, e.Existing)
			continue
		}
		if e.IfNoneExist != nil {
			existing, err := matchResource(ctx, tx, w, e.Type, *e.IfNoneExist, false)
			if f := fault.As(err); f != nil && f.Kind == fault.KindConflict {
				st.bad[i] = err
				continue
			}
			if err != nil {
				return err
			}
			if existing != "" {
				st.res[i] = TxResult{ID: existing}
				st.name(i, existing)
				continue
			}
		}
		id := ids.New(idPrefix(e.Type))
		if e.Type == "Patient" {
			id = ids.New(ids.Patient)
		}
		st.res[i] = TxResult{ID: id, Created: true}
		st.name(i, id)
		// A created resource's scope: a Patient's own flag; another's is its patient's, set in write.
		st.local[e.Type+"/"+id] = &patientScope{synthetic: !w.p.SeesRealPatients() || st.docs[i].testTagged()}
	}
	return nil
}

// lockConditions takes the locks of the transaction's conditional creates of the generic store
// (matchResource's), all at once and in one order, so that two transactions creating the same
// organizations and practitioners wait for each other instead of deadlocking.
func (st *txState) lockConditions(ctx context.Context, tx pgx.Tx, w writer) error {
	var keys []string
	for _, e := range st.entries {
		if e.IfNoneExist != nil && e.Type != "Patient" {
			keys = append(keys, conditionLock(w.orgID, e.Type, *e.IfNoneExist))
		}
	}
	if len(keys) == 0 {
		return nil
	}
	slices.Sort(keys)
	_, err := tx.Exec(ctx, `select pg_advisory_xact_lock(hashtextextended(k, 0)) from unnest($1::text[]) with ordinality as u(k, n) order by n`,
		slices.Compact(keys))
	return err
}

// name records how entry i, now e.Type/id, is named by others: its fullUrl and its identifiers.
func (st *txState) name(i int, id string) {
	e := st.entries[i]
	ref := e.Type + "/" + id
	if e.FullURL != "" {
		st.urls[e.FullURL] = ref
	}
	if st.cond.pending[e.Type] == nil {
		st.cond.pending[e.Type] = map[string][]string{}
	}
	for _, tok := range tokens(nil, st.docs[i]["identifier"], "value") {
		st.cond.pending[e.Type][tok] = appendNew(st.cond.pending[e.Type][tok], ref)
	}
}

// resolveObservations gives each Observation entry that has a urn:uuid fullUrl its id before it
// is written: intake derives it from the client id (the uuid) and the final body, so an
// Observation's references are resolved first, those naming other Observations in the order
// they allow. Observations that name each other in a cycle are refused.
func (st *txState) resolveObservations(ctx context.Context, s *Service, tx pgx.Tx, w writer, obsID ObservationIDFunc) error {
	pending := map[int]bool{}
	for i, e := range st.entries {
		if e.Type == "Observation" {
			pending[i] = true
			st.obsDeps[i] = map[string]bool{}
			walkRefs(map[string]any(st.docs[i]), func(ref string) string {
				if j := st.entryByURL(ref); j >= 0 && st.entries[j].Type == "Observation" {
					st.obsDeps[i][ref] = true
				}
				return ref
			})
		}
	}
	for progress := true; progress && len(pending) > 0; {
		progress = false
		for _, i := range sortedKeys(pending) {
			if !st.ready(i) {
				continue
			}
			delete(pending, i)
			progress = true
			if err := s.resolveConditional(ctx, tx, w, st.docs[i], &st.cond); err != nil {
				if fault.As(err) == nil {
					return err
				}
				st.bad[i] = err
				continue
			}
			if client, ok := strings.CutPrefix(st.entries[i].FullURL, "urn:uuid:"); ok && validID(client) {
				st.docs[i]["id"] = client
				body, _ := st.docs[i].encode()
				id := obsID(w.orgID, client, body)
				st.res[i] = TxResult{ID: id, Created: true, Body: body}
				st.urls[st.entries[i].FullURL] = "Observation/" + id
				st.local["Observation/"+id] = &patientScope{}
			}
		}
	}
	for i := range pending {
		st.bad[i] = fault.Validation("Observations of the transaction name each other in a cycle",
			map[string]string{"reference": "a cycle of Observation references between entries"})
	}
	return nil
}

func (st *txState) ready(i int) bool {
	for ref := range st.obsDeps[i] {
		if _, ok := st.urls[ref]; !ok {
			return false
		}
	}
	return true
}

func (st *txState) entryByURL(url string) int {
	for j, e := range st.entries {
		if e.FullURL != "" && e.FullURL == url {
			return j
		}
	}
	return -1
}

// resolveAll resolves every entry's remaining references (fullUrls, and conditional references
// against the transaction's entries and the store, in resolveConditional's one walk) and
// extracts its search values. A urn: reference that names no entry is refused: it could only
// dangle.
func (st *txState) resolveAll(ctx context.Context, s *Service, tx pgx.Tx, w writer) error {
	for i := range st.entries {
		if st.bad[i] != nil {
			continue
		}
		if err := s.resolveConditional(ctx, tx, w, st.docs[i], &st.cond); err != nil {
			if fault.As(err) == nil {
				return err
			}
			st.bad[i] = err
			continue
		}
		st.xs[i] = extract(st.entries[i].Type, st.docs[i])
		if dangling := st.xs[i].entryRefs; len(dangling) > 0 {
			st.bad[i] = fault.Validation("a reference names no entry of the transaction: "+strings.Join(dangling, ", "),
				map[string]string{"reference": "no entry has fullUrl " + strings.Join(dangling, ", ")})
		}
	}
	return nil
}

// write stores the Patients, then the generic resources (their patients exist by then), and
// checks the Observations' final bodies.
func (st *txState) write(ctx context.Context, s *Service, tx pgx.Tx, w writer, undo *TxUndo, check func(int, []byte) error) error {
	now := time.Now()
	for i, e := range st.entries {
		if e.Type != "Patient" || !st.res[i].Created {
			continue
		}
		body, _ := st.docs[i].encode()
		doc, err := insertPatient(ctx, tx, w, st.res[i].ID, body, st.local["Patient/"+st.res[i].ID].synthetic, now)
		if f := fault.As(err); f != nil {
			st.bad[i] = err
			continue
		} else if err != nil {
			return err
		}
		st.res[i].Doc = doc
		undo.patients = append(undo.patients, st.res[i].ID)
		access.Touch(ctx, access.KindPatient, st.res[i].ID)
	}
	if len(st.bad) > 0 {
		return nil
	}
	// A created resource's patient scope, for the references of the ones after it.
	for i, e := range st.entries {
		if e.Type == "Patient" || e.Type == "Observation" || !st.res[i].Created {
			continue
		}
		if pid := patientOf(st.docs[i]); pid != "" {
			if sc := st.local["Patient/"+pid]; sc != nil {
				*st.local[e.Type+"/"+st.res[i].ID] = *sc
			}
		}
	}
	if err := st.checkAllRefs(ctx, tx, w); err != nil {
		return err
	}
	var batch pgx.Batch
	var rows []*storedRow
	for i, e := range st.entries {
		switch {
		case st.bad[i] != nil:
		case e.Type == "Observation":
			if st.res[i].Body == nil {
				st.res[i] = TxResult{Created: true}
				st.res[i].Body, _ = st.docs[i].encode()
			}
			if err := s.checkRefs(ctx, tx, w, observationRefs(st.xs[i]), st.local); err != nil {
				st.bad[i] = err
			} else if err := check(i, st.res[i].Body); err != nil {
				st.bad[i] = err
			}
		case e.Type != "Patient" && st.res[i].Created:
			row, err := s.prepareStore(ctx, tx, w, e.Type, st.res[i].ID, st.docs[i], &st.xs[i], st.local, nil)
			if f := fault.As(err); f != nil {
				st.bad[i] = err
				continue
			} else if err != nil {
				return err
			}
			batch.Queue(storeSQL, row.args()...)
			rows = append(rows, row)
			st.res[i].Doc = row.out
			undo.resources = append(undo.resources, e.Type+"/"+st.res[i].ID)
		}
	}
	if len(st.bad) > 0 { // refused: the transaction is rolled back, nothing to write
		return nil
	}
	// Every resource in one round trip: a Synthea patient is hundreds of them.
	if batch.Len() > 0 {
		if err := tx.SendBatch(ctx, &batch).Close(); err != nil {
			return err
		}
	}
	for _, row := range rows {
		row.touch(ctx)
	}
	return st.fillMatched(ctx, s, tx, w)
}

// checkAllRefs looks up, in one query, every reference of the entries to be written that names no
// entry of the transaction, and records those found in local, so that each entry's own check
// (store, checkRefs) only looks up again what is missing, to word its refusal.
func (st *txState) checkAllRefs(ctx context.Context, tx pgx.Tx, w writer) error {
	var all []string
	seen := map[string]bool{}
	for i, e := range st.entries {
		if st.bad[i] != nil || e.Type == "Patient" || !st.res[i].Created && e.Type != "Observation" {
			continue
		}
		refs := st.xs[i].refs
		if e.Type == "Observation" {
			refs = observationRefs(st.xs[i])
		}
		for _, r := range refs {
			if _, ok := st.local[r]; !ok && !seen[r] {
				seen[r] = true
				all = append(all, r)
			}
		}
	}
	missing, err := missingRefs(ctx, tx, w, all)
	if err != nil {
		return err
	}
	for _, r := range all {
		if !slices.Contains(missing, r) {
			st.local[r] = nil // exists: its scope is read where needed
		}
	}
	return nil
}

// observationRefs are an Observation's references other than its subject (intake checks that),
// of its search values x.
func observationRefs(x extracted) []string {
	var out []string
	for _, r := range x.refs {
		if !strings.HasPrefix(r, "Patient/") {
			out = append(out, r)
		}
	}
	return out
}

// fillMatched reads the resources conditional creates matched, for the response.
func (st *txState) fillMatched(ctx context.Context, s *Service, tx pgx.Tx, w writer) error {
	for i, e := range st.entries {
		if st.bad[i] != nil || st.res[i].Created || e.Type == "Observation" {
			continue
		}
		var err error
		if e.Type == "Patient" {
			st.res[i].Doc, err = s.renderPatientByID(ctx, tx, st.res[i].ID)
		} else {
			st.res[i].Doc, err = currentDoc(ctx, tx, w.orgID, e.Type, st.res[i].ID)
		}
		if err != nil {
			return fmt.Errorf("read matched %s: %w", e.Type, err)
		}
	}
	return nil
}

// insertPatient creates patient id from a FHIR Patient body in tx, as CreatePatients does each
// of its patients (same checks, same row, same first version).
func insertPatient(ctx context.Context, tx pgx.Tx, w writer, id string, body []byte, synthetic bool, now time.Time) (json.RawMessage, error) {
	in, err := parsePatient(body, now)
	if err != nil {
		return nil, err
	}
	res, err := in.resource(id, w.orgID, synthetic, now)
	if err != nil {
		return nil, err
	}
	_, err = tx.Exec(ctx, `insert into patients (id, org_id, synthetic, name, gender, birth_date, address, telecom,
	risk_level, programs, resource, created_at, updated_at)
values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12)`,
		id, w.orgID, synthetic, in.name, in.gender, in.birthDate, nullRaw(in.address), nullRaw(in.telecom),
		in.risk, nonNilStrings(in.programs), res, now)
	if err != nil {
		return nil, err
	}
	return recordVersion(ctx, tx, id)
}

// RemoveTransaction deletes what a transaction created: the FHIR base's undo when Kafka then
// refused its Observations.
func (s *Service) RemoveTransaction(ctx context.Context, undo *TxUndo) error {
	if undo == nil {
		return nil
	}
	w, err := requireWriter(ctx)
	if err != nil {
		return err
	}
	if len(undo.resources) > 0 { // and their versions: no foreign key cascades (schemas/postgres 0045)
		if _, err := s.pool.Exec(ctx, `with gone as (
	delete from fhir_resources where org_id = $1 and type || '/' || id = any($2) returning org_id, type, id)
delete from fhir_resource_versions v using gone g where v.org_id = g.org_id and v.type = g.type and v.id = g.id`,
			w.orgID, undo.resources); err != nil {
			return fmt.Errorf("remove transaction: %w", err)
		}
	}
	if len(undo.patients) > 0 {
		return s.RemoveCreated(ctx, undo.patients)
	}
	return nil
}

func sortedKeys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}
