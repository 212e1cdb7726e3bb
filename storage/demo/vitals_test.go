package demo

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

func TestNEWS2(t *testing.T) {
	normal := vitals{RR: 16, SpO2: 97, SBP: 124, DBP: 78, HR: 72, Temp: 36.8, O2Flow: 0, GCS: 15}
	with := func(f func(*vitals)) vitals { v := normal; f(&v); return v }
	tests := []struct {
		name             string
		v                vitals
		total, maxSingle int
		risk             string
	}{
		{"normal", normal, 0, 0, riskLow},
		{"deteriorating patient", vitals{RR: 26, SpO2: 91, SBP: 95, DBP: 58, HR: 118, Temp: 38.6, O2Flow: 0, GCS: 15}, 11, 3, riskCritical},
		{"RR 8", with(func(v *vitals) { v.RR = 8 }), 3, 3, riskModerate},
		{"RR 9", with(func(v *vitals) { v.RR = 9 }), 1, 1, riskLow},
		{"RR 21", with(func(v *vitals) { v.RR = 21 }), 2, 2, riskLow},
		{"RR 25", with(func(v *vitals) { v.RR = 25 }), 3, 3, riskModerate},
		{"SpO2 94", with(func(v *vitals) { v.SpO2 = 94 }), 1, 1, riskLow},
		{"SpO2 92", with(func(v *vitals) { v.SpO2 = 92 }), 2, 2, riskLow},
		{"on oxygen", with(func(v *vitals) { v.O2Flow = 2 }), 2, 2, riskLow},
		{"SBP 90", with(func(v *vitals) { v.SBP = 90 }), 3, 3, riskModerate},
		{"SBP 101", with(func(v *vitals) { v.SBP = 101 }), 1, 1, riskLow},
		{"SBP 220", with(func(v *vitals) { v.SBP = 220 }), 3, 3, riskModerate},
		{"HR 40", with(func(v *vitals) { v.HR = 40 }), 3, 3, riskModerate},
		{"HR 50", with(func(v *vitals) { v.HR = 50 }), 1, 1, riskLow},
		{"HR 91", with(func(v *vitals) { v.HR = 91 }), 1, 1, riskLow},
		{"HR 130", with(func(v *vitals) { v.HR = 130 }), 2, 2, riskLow},
		{"HR 131", with(func(v *vitals) { v.HR = 131 }), 3, 3, riskModerate},
		{"temp 35.0", with(func(v *vitals) { v.Temp = 35.0 }), 3, 3, riskModerate},
		{"temp 36.0", with(func(v *vitals) { v.Temp = 36.0 }), 1, 1, riskLow},
		{"temp 38.1", with(func(v *vitals) { v.Temp = 38.1 }), 1, 1, riskLow},
		{"temp 39.1", with(func(v *vitals) { v.Temp = 39.1 }), 2, 2, riskLow},
		{"confused", with(func(v *vitals) { v.GCS = 14 }), 3, 3, riskModerate},
		{"medium", vitals{RR: 22, SpO2: 95, SBP: 105, DBP: 60, HR: 95, Temp: 37, GCS: 15}, 5, 2, riskHigh},
		{"four", vitals{RR: 21, SpO2: 95, SBP: 112, DBP: 60, HR: 95, Temp: 37, GCS: 15}, 4, 2, riskModerate},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			total, maxSingle := news2(tt.v)
			if total != tt.total || maxSingle != tt.maxSingle {
				t.Errorf("news2 = %d (max %d), want %d (max %d)", total, maxSingle, tt.total, tt.maxSingle)
			}
			if got := riskLevel(total, maxSingle); got != tt.risk {
				t.Errorf("riskLevel = %s, want %s", got, tt.risk)
			}
		})
	}
}

func TestTrajectory(t *testing.T) {
	for _, risk := range []string{riskLow, riskModerate, riskHigh, riskCritical} {
		t.Run(risk, func(t *testing.T) {
			for i := range 200 {
				r := rand.New(rand.NewPCG(uint64(i), 7))
				tr := newTrajectory(r, risk)
				rs := tr.readings(r)
				if len(rs) != readingsPerPatient {
					t.Fatalf("%d readings, want %d", len(rs), readingsPerPatient)
				}
				if got := riskLevel(news2(rs[len(rs)-1])); got != risk {
					t.Fatalf("trajectory %d ends at %+v: %s, want %s", i, rs[len(rs)-1], got, risk)
				}
				if risk != riskLow && riskLevel(news2(tr.start)) != riskLow {
					t.Fatalf("%s trajectory %d starts from %+v, want a normal start", risk, i, tr.start)
				}
				if first, _ := news2(rs[0]); first > 4 {
					t.Fatalf("%s trajectory %d: first reading %+v scores %d, want at most 4 (start plus noise)", risk, i, rs[0], first)
				}
			}
		})
	}
}

// latestVitals reads a patient's newest value of each vital sign.
func latestVitals(t *testing.T, pool *pgxpool.Pool, patientID string) vitals {
	t.Helper()
	rows, err := pool.Query(t.Context(), `select distinct on (loinc) loinc, value from observations
		where patient_id = $1 order by loinc, effective_at desc`, patientID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var v vitals
	fields := map[string]*float64{"9279-1": &v.RR, "59408-5": &v.SpO2, "8480-6": &v.SBP, "8462-4": &v.DBP,
		"8867-4": &v.HR, "8310-5": &v.Temp, "3151-8": &v.O2Flow, "9269-2": &v.GCS}
	seen := 0
	for rows.Next() {
		var code string
		var value float64
		if err := rows.Scan(&code, &value); err != nil {
			t.Fatal(err)
		}
		if f, ok := fields[code]; ok {
			*f = value
			seen++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if seen != len(fields) {
		t.Fatalf("patient %s: %d of %d vital signs", patientID, seen, len(fields))
	}
	return v
}

// checkNamedPatients: the exported patients' newest vitals are the documented ones, and the
// deteriorating patient got there from normal.
func checkNamedPatients(t *testing.T, pool *pgxpool.Pool) {
	want := map[string]vitals{
		DeterioratingPatientID: {RR: 26, SpO2: 91, SBP: 95, DBP: 58, HR: 118, Temp: 38.6, O2Flow: 0, GCS: 15},
		StablePatientID:        {RR: 16, SpO2: 97, SBP: 124, DBP: 78, HR: 72, Temp: 36.8, O2Flow: 0, GCS: 15},
	}
	for id, w := range want {
		if got := latestVitals(t, pool, id); got != w {
			t.Errorf("patient %s latest vitals %+v, want %+v", id, got, w)
		}
	}
	if score, _ := news2(latestVitals(t, pool, DeterioratingPatientID)); score < 7 {
		t.Errorf("deteriorating patient NEWS2 %d, want ≥ 7", score)
	}
	if score, _ := news2(latestVitals(t, pool, StablePatientID)); score > 1 {
		t.Errorf("stable patient NEWS2 %d, want ≤ 1", score)
	}
	var risk string
	if err := pool.QueryRow(t.Context(), `select risk_level from patients where id = $1`, DeterioratingPatientID).Scan(&risk); err != nil {
		t.Fatal(err)
	}
	if risk != riskCritical {
		t.Errorf("deteriorating patient risk_level %q, want critical", risk)
	}
	// The first third of its readings are normal; the last are not.
	var firstRR, firstSpO2 float64
	err := pool.QueryRow(t.Context(), `select max(value) filter (where loinc = '9279-1'), min(value) filter (where loinc = '59408-5')
		from (select loinc, value, rank() over (partition by loinc order by effective_at) n
		from observations where patient_id = $1) x where n <= 6`, DeterioratingPatientID).Scan(&firstRR, &firstSpO2)
	if err != nil {
		t.Fatal(err)
	}
	if firstRR > 20 || firstSpO2 < 95 {
		t.Errorf("deteriorating patient's early readings RR ≤ %v, SpO2 ≥ %v; want a normal start", firstRR, firstSpO2)
	}
}

// checkRiskLevels: every patient's risk_level is the NEWS2 band of its newest vitals.
func checkRiskLevels(t *testing.T, pool *pgxpool.Pool) {
	rows, err := pool.Query(t.Context(), `select id, risk_level from patients order by id`)
	if err != nil {
		t.Fatal(err)
	}
	type pr struct{ id, risk string }
	var patients []pr
	for rows.Next() {
		var p pr
		if err := rows.Scan(&p.id, &p.risk); err != nil {
			t.Fatal(err)
		}
		patients = append(patients, p)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, p := range patients {
		v := latestVitals(t, pool, p.id)
		if got := riskLevel(news2(v)); got != p.risk {
			t.Errorf("patient %s: risk_level %s but latest vitals %+v are %s", p.id, p.risk, v, got)
		}
		counts[p.risk]++
	}
	t.Log("patients per risk level:", fmt.Sprint(counts))
}
