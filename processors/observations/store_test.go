package observations_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"carehub/kernel/ids"
	obs "carehub/processors/observations"
	"carehub/schemas/kafka/observation"
)

// TestStoredResource stores the same observations by the direct COPY and by the staged insert,
// whatever odd JSON a client sent, and checks the stored resource, a json column kept as text:
// both paths store the same columns and text; it holds what jsonb made of the client's resource
// with carehub's id and the client's id as an identifier (the SQL the staged insert ran while the
// column was jsonb: jsonb's rules for repeated and escaped keys are Postgres's own); and it is
// compact, each key once, with carehub's id after resourceType.
func TestStoredResource(t *testing.T) {
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
		{"repeated identifiers", `"identifier":[{"value":"1"}],"identifier":[ {"value":"2"} ],`, "c5"},
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
				err := e.pool.QueryRow(ctx, `select jsonb_build_object('direct', to_jsonb(a), 'staged', to_jsonb(b))
from observations a, observations b
where a.id = $1 and b.id = $2
	and (to_jsonb(a) - 'id' - 'stored_at' - 'resource', replace(a.resource::text, a.id, '')) is not distinct from
		(to_jsonb(b) - 'id' - 'stored_at' - 'resource', replace(b.resource::text, b.id, ''))`, m.ID, twin.ID).Scan(&diff)
				if err != nil {
					t.Fatalf("stored differently (code present: %v): %v", withCode, err)
				}
				var text string
				var asJSONB bool
				err = e.pool.QueryRow(ctx, `select o.resource::text, o.resource::jsonb = case when $3::text is null then $2::jsonb || jsonb_build_object('id', o.id)
	else $2::jsonb || jsonb_build_object('id', o.id, 'identifier',
		(case when jsonb_typeof($2::jsonb->'identifier') = 'array' then $2::jsonb->'identifier' else '[]'::jsonb end)
		|| jsonb_build_array(jsonb_build_object('system', $4::text, 'value', $3::text)))
	end
from observations o where o.id = $1`, m.ID, body, nullable(c.clientID), obs.ClientIDSystem).Scan(&text, &asJSONB)
				if err != nil || !asJSONB {
					t.Fatalf("stored %s, not what jsonb made of %s: %v", text, body, err)
				}
				compact := new(bytes.Buffer)
				if err := json.Compact(compact, []byte(text)); err != nil || compact.String() != text {
					t.Fatalf("stored %s, not compact: %v", text, err)
				}
				if !strings.HasPrefix(text, `{"resourceType":"Observation","id":"`+m.ID+`",`) {
					t.Fatalf("stored %s: not resourceType then id", text)
				}
				if n := count(t, e.pool, `select count(*) - count(distinct k) from observations, json_object_keys(resource) k where id = $1`, m.ID); n != 0 {
					t.Fatalf("stored %s: %d repeated keys", text, n)
				}
			}
		})
	}
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
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
