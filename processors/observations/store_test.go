package observations_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	obs "carehub/processors/observations"
	"carehub/schemas/kafka/observation"
	"carehub/storage/ids"
)

// TestStoredFormMatchesStagedInsert stores the same observations by the direct COPY and by the
// staged insert, which computes the stored columns in SQL, and compares every column: the two
// paths of the store must store the same rows, whatever odd JSON a client sent.
func TestStoredFormMatchesStagedInsert(t *testing.T) {
	e := newEnv(t)
	direct, staged := obs.StorePaths(e.pool)
	ctx := context.Background()
	subject := `"subject":{"reference":"Patient/` + e.patientA + `"}`
	for _, c := range []struct {
		name, resource, clientID string
	}{
		{"plain", "", ""},
		{"client id", "", "dev-7.a_1"},
		{"client id and identifiers", `"identifier":[{"system":"urn:x","value":"1"}],`, "c1"},
		{"empty identifier", `"identifier":[ ],`, "c1"},
		{"null identifier", `"identifier":null,`, "c1"},
		{"object identifier", `"identifier":{"value":"1"},`, "c1"},
		{"identifiers without client id", `"identifier":[{"value":"1"},{"value":"2"}],`, ""},
		{"client's id replaced", `"id":"theirs",`, "theirs"},
		{"escaped and repeated keys", `"\u0063ode":{"text":"first"},"code":{"text":"last"},"subj\u0065ct":{"reference":"Patient/x"},`, ""},
		{"keys differing in case", `"Code":{"text":"upper"},"Identifier":[1],`, "c2"},
		{"strings holding JSON", `"note":[{"text":"a \"]},{\" \\ b"}],"x":"}",`, ""},
		{"nulls", `"subject":null,"code":null,`, "c3"},
		{"numbers and literals", `"n":-1.5e3,"t":true,"f":false,"z":null,`, "c4"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, withCode := range []bool{true, false} {
				m := message(e.orgA, e.patientA, 70)
				body := `{"resourceType":"Observation","status":"final",` + c.resource + `"effectiveDateTime":"2026-11-01T08:00:00Z"`
				if withCode {
					body += `,"code":{"coding":[{"system":"http://loinc.org","code":"8867-4"}]},` + subject
				}
				if strings.HasPrefix(c.name, "strings") {
					body = " \n" + strings.ReplaceAll(body, `":`, "\" :\n\t") + " } \n"
				} else {
					body += "}"
				}
				if !json.Valid([]byte(body)) {
					t.Fatalf("invalid test JSON %s", body)
				}
				m.Observation, m.ClientID = json.RawMessage(body), c.clientID
				twin := m
				twin.ID = ids.New(ids.Observation)
				if n, err := direct(ctx, []observation.Message{m}); err != nil || n != 1 {
					t.Fatalf("direct: %d, %v", n, err)
				}
				if n, err := staged(ctx, []observation.Message{twin}); err != nil || n != 1 {
					t.Fatalf("staged: %d, %v", n, err)
				}
				var diff []byte
				err := e.pool.QueryRow(ctx, `select jsonb_build_object(
	'direct', to_jsonb(a) - 'id' - 'stored_at' || jsonb_build_object('resource', a.resource - 'id'),
	'staged', to_jsonb(b) - 'id' - 'stored_at' || jsonb_build_object('resource', b.resource - 'id'))
from observations a, observations b
where a.id = $1 and b.id = $2 and a.resource->>'id' = a.id and b.resource->>'id' = b.id
	and (to_jsonb(a) - 'id' - 'stored_at' - 'resource', a.resource - 'id') is distinct from
		(to_jsonb(b) - 'id' - 'stored_at' - 'resource', b.resource - 'id')`, m.ID, twin.ID).Scan(&diff)
				if err == nil {
					t.Fatalf("stored differently (code present: %v): %s", withCode, diff)
				}
				if n := count(t, e.pool, `select count(*) from observations where id in ($1, $2) and resource->>'id' = id`, m.ID, twin.ID); n != 2 {
					t.Fatalf("%d of 2 stored with their id", n)
				}
			}
		})
	}
}

// TestObservedPatientIsNotDeleted: observations have no foreign keys (the writer checks its
// chunks' patients itself), yet a patient with observations still cannot be deleted, and one
// without can.
func TestObservedPatientIsNotDeleted(t *testing.T) {
	e := newEnv(t)
	direct, _ := obs.StorePaths(e.pool)
	ctx := context.Background()
	if n, err := direct(ctx, []observation.Message{message(e.orgA, e.patientA, 70)}); err != nil || n != 1 {
		t.Fatalf("stored %d, %v", n, err)
	}
	_, err := e.pool.Exec(ctx, `delete from patients where id = any($1)`, []string{e.patientA, e.patientB})
	if pg := (*pgconn.PgError)(nil); !errors.As(err, &pg) || pg.Code != "23503" {
		t.Fatalf("deleting an observed patient: %v; want foreign_key_violation", err)
	}
	if _, err := e.pool.Exec(ctx, `delete from patients where id = $1`, e.patientB); err != nil {
		t.Fatalf("deleting a patient without observations: %v", err)
	}
	// A chunk whose patient is gone stores nothing of it.
	if n, err := direct(ctx, []observation.Message{message(e.orgB, e.patientB, 70), message(e.orgB, e.patientA, 71)}); err != nil || n != 0 {
		t.Fatalf("stored %d of a deleted and a foreign patient, %v", n, err)
	}
}
