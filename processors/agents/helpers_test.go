package agents_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/access"
	"carehub/kernel/clinical"
	"carehub/storage/demo"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// seeded returns a pool on a fresh database with the demo data.
func seeded(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.New(t)
	if _, err := demo.Seed(context.Background(), pool, nil); err != nil {
		t.Fatalf("seed: %v", err)
	}
	return pool
}

// caller is a context carrying a live demo-health principal with every scope.
func caller(t testing.TB) context.Context {
	return access.With(t.Context(), &access.Principal{OrgID: demo.DemoOrgID, KeyID: "key_test", Mode: access.Live, Scopes: access.Scopes})
}

// latest reads a patient's latest stored value per LOINC code straight from the observations
// table, with the observation id, as the test's independent view of "the database rows".
type reading struct {
	id    string
	value float64
}

func latest(t testing.TB, pool *pgxpool.Pool, patientID string) map[string]reading {
	t.Helper()
	rows, err := pool.Query(context.Background(), `select loinc, id, value from observations o where patient_id = $1 and value is not null
and effective_at = (select max(effective_at) from observations x where x.patient_id = o.patient_id and x.loinc = o.loinc and x.value is not null)`, patientID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]reading{}
	for rows.Next() {
		var code string
		var r reading
		if err := rows.Scan(&code, &r.id, &r.value); err != nil {
			t.Fatal(err)
		}
		if cur, ok := out[code]; !ok || r.id > cur.id {
			out[code] = r
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// band returns the points of x in a table of (upper bound inclusive, points) rows, ascending.
func band(x float64, rows [][2]float64) int {
	for _, r := range rows {
		if x <= r[0] {
			return int(r[1])
		}
	}
	panic("no row")
}

const inf = 1e9

// handNEWS2 scores NEWS2 from the RCP 2017 chart, written out here independently of the clinical
// package: SpO2 scale 1, oxygen from the flow rate, consciousness from GCS. It returns the total
// and the per-parameter points.
func handNEWS2(v map[string]reading) (int, map[string]int) {
	p := map[string]int{
		"respiratory_rate": band(v[clinical.LOINCRespiratoryRate].value, [][2]float64{{8, 3}, {11, 1}, {20, 0}, {24, 2}, {inf, 3}}),
		"spo2":             band(v[clinical.LOINCOxygenSaturation].value, [][2]float64{{91, 3}, {93, 2}, {95, 1}, {inf, 0}}),
		"systolic_bp":      band(v[clinical.LOINCSystolicBP].value, [][2]float64{{90, 3}, {100, 2}, {110, 1}, {219, 0}, {inf, 3}}),
		"heart_rate":       band(v[clinical.LOINCHeartRate].value, [][2]float64{{40, 3}, {50, 1}, {90, 0}, {110, 1}, {130, 2}, {inf, 3}}),
		"temperature":      band(v[clinical.LOINCBodyTemperature].value, [][2]float64{{35.0, 3}, {36.0, 1}, {38.0, 0}, {39.0, 1}, {inf, 2}}),
	}
	if v[clinical.LOINCInhaledOxygenFlow].value > 0 {
		p["supplemental_oxygen"] = 2
	} else {
		p["supplemental_oxygen"] = 0
	}
	if v[clinical.LOINCGlasgowComaScore].value < 15 {
		p["consciousness"] = 3
	} else {
		p["consciousness"] = 0
	}
	total := 0
	for _, x := range p {
		total += x
	}
	return total, p
}

// handQSOFA scores qSOFA (Sepsis-3): RR ≥ 22, SBP ≤ 100, GCS < 15, one point each.
func handQSOFA(v map[string]reading) int {
	n := 0
	if v[clinical.LOINCRespiratoryRate].value >= 22 {
		n++
	}
	if v[clinical.LOINCSystolicBP].value <= 100 {
		n++
	}
	if v[clinical.LOINCGlasgowComaScore].value < 15 {
		n++
	}
	return n
}

// output is the stored output of a session as a client reads it.
type output struct {
	Skill      string `json:"skill"`
	Score      *int   `json:"score"`
	Band       string `json:"band"`
	Severity   string `json:"severity"`
	Positive   *bool  `json:"positive"`
	ReportID   string `json:"reportId"`
	Components []struct {
		Name          string `json:"name"`
		Score         *int   `json:"score"`
		ObservationID string `json:"observationId"`
	} `json:"components"`
	Recommendations []string `json:"recommendations"`
	ObservationIDs  []string `json:"observationIds"`
}

func decodeOutput(t testing.TB, raw json.RawMessage) output {
	t.Helper()
	var o output
	if err := json.Unmarshal(raw, &o); err != nil {
		t.Fatalf("output %s: %v", raw, err)
	}
	return o
}

// count returns a count(*) query's result.
func count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	return pgtest.Scalar[int](t, pool, sql, args...)
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
