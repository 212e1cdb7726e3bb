package postgres_test

import (
	"context"
	"slices"
	"testing"

	"carehub/kernel/access"
	"carehub/kernel/ids"
	"carehub/kernel/phi"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

// TestGuardAllow: phi.Guard's rule (DECISIONS §2) over real Postgres rows, synthetic
// patients told apart by SyntheticPatients.
func TestGuardAllow(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	org := func() string {
		id := ids.New(ids.Organization)
		if _, err := pool.Exec(ctx, `insert into organizations (id, name, slug, type, plan) values ($1, 'o', $1, 'clinic', 'starter')`, id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	patient := func(org string, synthetic bool) string {
		id := ids.New(ids.Patient)
		if _, err := pool.Exec(ctx, `insert into patients (id, org_id, synthetic, name) values ($1, $2, $3, '[]')`, id, org, synthetic); err != nil {
			t.Fatal(err)
		}
		return id
	}
	a, b := org(), org()
	real, synth, foreignSynth := patient(a, false), patient(a, true), patient(b, true)

	subjects := []phi.Subject{
		{OrgID: a, Patients: []string{synth}, Need: phi.NeedPatients},                            // 0
		{OrgID: a, Patients: []string{real}, Need: phi.NeedPatients},                             // 1
		{OrgID: a, Patients: []string{synth, real}, Need: phi.NeedPatients},                      // 2
		{OrgID: a, Patients: []string{synth}, Need: phi.NeedObservations},                        // 3
		{OrgID: a, Patients: []string{foreignSynth}, Need: phi.NeedPatients},                     // 4: another organization's patient
		{OrgID: a, Patients: []string{"pat_01jz00000000000000000000zz"}, Need: phi.NeedPatients}, // 5: unknown
		{OrgID: a, Patients: []string{synth}, Unidentified: true, Need: phi.NeedPatients},        // 6
		{OrgID: a, Need: phi.NeedPatients},                                                       // 7: names nobody
	}
	full := phi.Reader{Patients: true, Observations: true}
	for _, tc := range []struct {
		name   string
		reader phi.Reader
		want   []bool
	}{
		{"live, both scopes", phi.Reader{Patients: true, Observations: true, Live: true}, []bool{true, true, true, true, true, true, true, true}},
		{"live, read:patients", phi.Reader{Patients: true, Live: true}, []bool{true, true, true, false, true, true, true, true}},
		{"live, no patient scope", phi.Reader{Observations: true, Live: true}, []bool{false, false, false, false, false, false, false, false}},
		{"test, both scopes", full, []bool{true, false, false, true, false, false, false, true}},
		{"test, no scope", phi.Reader{}, []bool{false, false, false, false, false, false, false, false}},
	} {
		got, err := phi.NewGuard(postgres.SyntheticPatients{Pool: pool}).Allow(ctx, tc.reader, subjects)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: Allow = %v, want %v", tc.name, got, tc.want)
		}
	}

	// Serve touches the patients of what it allows, and only those.
	p := &access.Principal{OrgID: a, Mode: access.Test, Scopes: []string{access.ReadPatients}}
	rctx, rec := access.WithRecorder(access.With(ctx, p))
	if _, err := phi.NewGuard(postgres.SyntheticPatients{Pool: pool}).Serve(rctx, subjects[:2]); err != nil {
		t.Fatal(err)
	}
	if got := rec.PatientIDs(); !slices.Equal(got, []string{synth}) {
		t.Errorf("touched %v, want [%s]", got, synth)
	}
}
