package demo

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/storage/postgres/pgtest"
)

var update = flag.Bool("update", false, "rewrite testdata/checksums.golden from this run")

func TestMain(m *testing.M) { pgtest.Main(m) }

// seeded returns a fresh database holding the demo data.
func seeded(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.New(t)
	s, err := Seed(t.Context(), pool, nil)
	if err != nil {
		t.Fatalf("Seed: %v", err)
	}
	if s.Skipped {
		t.Fatal("Seed skipped on an empty database")
	}
	t.Logf("seeded in %v: %+v", s.Elapsed, s)
	return pool
}

func queryInt(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	return pgtest.Scalar[int](t, pool, sql, args...)
}

func queryStrings(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return out
}

func TestSeed(t *testing.T) {
	pool := pgtest.New(t)
	s, err := Seed(t.Context(), pool, nil)
	if err != nil {
		t.Fatalf("Seed: %v", err)
	}
	t.Logf("seeded in %v", s.Elapsed)

	t.Run("summary matches tables", func(t *testing.T) {
		for table, n := range map[string]int{
			"organizations": s.Organizations, "projects": s.Projects, "publishers": s.Publishers,
			"assets": s.Assets, "installations": s.Installations, "agents": s.Agents,
			"workflows": s.Workflows, "patients": s.Patients, "encounters": s.Encounters,
			"observations": s.Observations,
		} {
			if got := queryInt(t, pool, "select count(*) from "+table); got != n || n == 0 {
				t.Errorf("%s: Summary says %d, table has %d", table, n, got)
			}
		}
	})

	// Each query must return 0 (nothing missing, nothing inconsistent) or the stated minimum.
	checks := []struct {
		name string
		sql  string
		min  int // the query's result must be at least min; min 0 means it must be exactly 0
	}{
		{"at least 40 assets", `select count(*) from assets`, 40},
		{"every asset type", `select count(*) from unnest(array['MODEL','AGENT','CONNECTOR','DATASET','SOLUTION','APP']) v
			where not exists (select 1 from assets where type = v)`, 0},
		{"every pricing type", `select count(*) from unnest(array['FREE','USAGE_BASED','SUBSCRIPTION','ENTERPRISE']) v
			where not exists (select 1 from assets where pricing_type = v)`, 0},
		{"every asset status", `select count(*) from unnest(array['DRAFT','UNDER_REVIEW','APPROVED','REJECTED','DEPRECATED']) v
			where not exists (select 1 from assets where status = v)`, 0},
		{"mostly approved", `select count(*) filter (where status = 'APPROVED') * 2 - count(*) from assets`, 1},
		{"pricing fields fit the pricing type", `select count(*) from assets where not case pricing_type
			when 'FREE' then coalesce(cost_per_request, monthly_fee, annual_fee, free_tier_limit) is null
			when 'USAGE_BASED' then cost_per_request > 0 and monthly_fee is null and annual_fee is null
			when 'SUBSCRIPTION' then monthly_fee > 0 and annual_fee > 0 and cost_per_request is null
			when 'ENTERPRISE' then annual_fee > 0 and monthly_fee is null and cost_per_request is null end`, 0},
		{"usage pricing with a free tier", `select count(*) from assets where free_tier_limit > 0`, 1},
		{"hipaa_compliant iff HIPAA badge", `select count(*) from assets where hipaa_compliant <> ('HIPAA' = any(badges))`, 0},
		{"fda_cleared iff FDA badge", `select count(*) from assets where fda_cleared <> ('FDA 510(k)' = any(badges))`, 0},
		{"HIPAA means high privacy score", `select count(*) from assets where hipaa_compliant and score_privacy < 85`, 0},
		{"FDA means high clinical score", `select count(*) from assets where fda_cleared and score_clinical < 85`, 0},
		{"scores within 0..100", `select count(*) from assets where least(score_overall, score_security, score_privacy, score_clinical) < 0
			or greatest(score_overall, score_security, score_privacy, score_clinical) > 100`, 0},
		{"Verified Publisher badge only for verified publishers", `select count(*) from assets a join publishers p on p.id = a.publisher_id
			where 'Verified Publisher' = any(a.badges) and not p.verified`, 0},
		{"Top Rated badge only for high ratings", `select count(*) from assets where 'Top Rated' = any(badges) and not rating >= 4.7`, 0},
		{"ratings 1.0..5.0 with one decimal", `select count(*) from assets where rating is not null
			and (rating < 1 or rating > 5 or round(rating::numeric, 1) <> rating::numeric)`, 0},
		{"some ratings null", `select count(*) from assets where rating is null`, 1},
		{"fhir_resources are FHIRResourceType values", `select count(*) from assets, unnest(fhir_resources) r
			where r not in ('Patient','Observation','DiagnosticReport','Encounter','Condition','MedicationRequest','CarePlan','Device','Practitioner')`, 0},
		{"catalogue in chronological order", `select count(*) from (
			select a.created_at < p.created_at or a.updated_at < a.created_at from assets a join publishers p on p.id = a.publisher_id
			union all select p.created_at < o.created_at from publishers p join organizations o on o.id = p.org_id
			union all select p.created_at < o.created_at from projects p join organizations o on o.id = p.org_id
			union all select i.installed_at < greatest(a.updated_at, p.created_at) from installations i
				join assets a on a.id = i.asset_id join projects p on p.id = i.project_id
			union all select g.created_at < i.installed_at from agents g join installations i on i.id = g.installation_id
			union all select w.created_at < p.created_at from workflows w join projects p on p.id = w.project_id
			union all select p.created_at < o.created_at from patients p join organizations o on o.id = p.org_id
			union all select e.created_at < p.created_at from encounters e join patients p on p.id = e.patient_id
			union all select max(o.effective_at) >= '2026-11-01' from observations o) x(bad) where bad`, 0},
		{"every asset lists FHIR resources", `select count(*) from assets where cardinality(fhir_resources) = 0`, 0},
		{"some assets submitted by a developer org", `select count(*) from assets a join organizations o on o.id = a.submitted_by_org
			where o.type = 'developer'`, 1},
		{"rejected assets carry review notes", `select count(*) from assets where (status = 'REJECTED') <> (review_notes is not null)`, 0},
		{"built-in runtime assets", `select count(*) from (values
			('MODEL','news2','NEWS2 Early Warning Score'), ('AGENT','news2','Deterioration Watch Agent'),
			('MODEL','qsofa','qSOFA Sepsis Screen'), ('AGENT','qsofa','Sepsis Sentinel Agent'),
			('AGENT','vitals_trend','Vitals Trend Summarizer')) v(type, runtime, name)
			where not exists (select 1 from assets a where a.type = v.type and a.runtime = v.runtime and a.name = v.name
			and a.status = 'APPROVED' and a.hipaa_compliant)`, 0},
		{"verified and unverified publishers", `select count(distinct verified) from publishers`, 2},
		{"publishers with and without organization", `select count(distinct org_id is null) from publishers`, 2},

		{"every organization type", `select count(*) from unnest(array['health_system','clinic','payer','developer','research']) v
			where not exists (select 1 from organizations where type = v)`, 0},
		{"every plan", `select count(*) from unnest(array['starter','growth','enterprise']) v
			where not exists (select 1 from organizations where plan = v)`, 0},
		{"some fhir_base null", `select count(*) from organizations where fhir_base is null`, 1},
		{"every organization has a project", `select count(*) from organizations o where not exists (select 1 from projects where org_id = o.id)`, 0},
		{"demo-health is the first organization", `select count(*) from (select slug, type from organizations order by created_at, id limit 1) o
			where slug = 'demo-health' and type = 'health_system'`, 1},
		{"demo-health projects", `select count(*) from projects p join organizations o on o.id = p.org_id
			where o.slug = 'demo-health' and p.name in ('Sepsis Early Warning', 'Remote Patient Monitoring')`, 2},
		{"NEWS2 agent installed in demo-health", `select count(*) from installations i join organizations o on o.id = i.org_id
			join assets a on a.id = i.asset_id where o.slug = 'demo-health' and a.name = 'Deterioration Watch Agent'`, 1},
		{"only approved assets installed", `select count(*) from installations i join assets a on a.id = i.asset_id where a.status <> 'APPROVED'`, 0},
		{"installation in its own org's project", `select count(*) from installations i join projects p on p.id = i.project_id where p.org_id <> i.org_id`, 0},
		{"Ward 7 agent", `select count(*) from agents a join organizations o on o.id = a.org_id join projects p on p.id = a.project_id
			join installations i on i.id = a.installation_id join assets s on s.id = i.asset_id
			where o.slug = 'demo-health' and a.name = 'Ward 7 Deterioration Agent' and a.skill = 'news2' and a.run_mode = 'sync'
			and p.name = 'Sepsis Early Warning' and s.runtime = 'news2'`, 1},
		{"Deterioration alert workflow", `select count(*) from workflows w join organizations o on o.id = w.org_id
			where o.slug = 'demo-health' and w.name = 'Deterioration alert' and w.status = 'ACTIVE' and w.triggers = '{}'
			and w.steps = array['load_patient','latest_vitals','score_news2','assess_risk','create_alert']`, 1},

		{"at least 200 patients", `select count(*) from patients`, 200},
		{"most patients in demo-health", `select count(*) filter (where o.slug = 'demo-health') * 2 - count(*)
			from patients p join organizations o on o.id = p.org_id`, 1},
		{"patients in several organizations", `select count(distinct org_id) from patients`, 5},
		{"some real patients in demo-health", `select count(*) from patients p join organizations o on o.id = p.org_id
			where o.slug = 'demo-health' and not p.synthetic`, 10},
		{"every risk level", `select count(*) from unnest(array['low','moderate','high','critical']) v
			where not exists (select 1 from patients where risk_level = v)`, 0},
		{"FHIR-shaped patients", `select count(*) from patients where not (
			jsonb_typeof(name->0->'given') = 'array' and name->0->>'family' <> '' and name->0->>'use' = 'official'
			and gender in ('female','male','other') and birth_date ~ '^\d{4}-\d{2}-\d{2}$'
			and address->0->'line'->>0 <> '' and address->0->>'city' <> '' and address->0->>'postalCode' ~ '^\d{5}$'
			and telecom->0->>'system' = 'phone' and telecom->0->>'value' ~ '^\d{3}-555-01\d{2}$'
			and resource->>'resourceType' = 'Patient' and resource->>'id' = id and resource->'name' = name
			and resource->>'gender' = gender and resource->>'birthDate' = birth_date and resource->'address' = address
			and resource->'telecom' = telecom)`, 0},
		{"synthetic tag iff synthetic", `select count(*) from patients where synthetic <> coalesce(resource->'meta'->'tag' @> '[{"code":"HTEST"}]', false)`, 0},
		{"patients in care programs", `select count(*) from patients where programs && array['chf-remote-monitoring','copd-home','sepsis-watch','diabetes-care']`, 50},

		{"all eight vital signs for every patient", `select count(*) from patients p where (select array_agg(distinct loinc order by loinc)
			from observations o where o.patient_id = p.id) is distinct from
			array['3151-8','59408-5','8310-5','8462-4','8480-6','8867-4','9269-2','9279-1']`, 0},
		{"several days of readings", `select count(*) from (select patient_id from observations group by patient_id
			having max(effective_at) - min(effective_at) < interval '2 days') x`, 0},
		{"observation columns agree with the resource", `select count(*) from observations where not (
			status = 'final' and resource->>'resourceType' = 'Observation' and resource->>'id' = id and resource->>'status' = status
			and code->'coding'->0->>'system' = 'http://loinc.org' and code->'coding'->0->>'code' = loinc
			and code->'coding'->0->>'display' = code->>'text' and (resource->'code')::jsonb = code and (resource->'subject')::jsonb = subject
			and subject->>'reference' = 'Patient/' || patient_id
			and (resource->'valueQuantity'->>'value')::float8 = value and resource->'valueQuantity'->>'unit' = unit
			and resource->'valueQuantity'->>'code' = unit and resource->'valueQuantity'->>'system' = 'http://unitsofmeasure.org'
			and (resource->>'effectiveDateTime')::timestamptz = effective_at
			and resource->'category'->0->'coding'->0->>'code' = 'vital-signs'
			and received_at >= effective_at and stored_at >= received_at and device_type <> '')`, 0},
		{"observations in the patient's org", `select count(*) from observations o join patients p on p.id = o.patient_id where o.org_id <> p.org_id`, 0},
		{"UCUM units", `select count(*) from observations where (loinc, unit) not in (('9279-1','/min'), ('59408-5','%'),
			('8480-6','mm[Hg]'), ('8462-4','mm[Hg]'), ('8867-4','/min'), ('8310-5','Cel'), ('3151-8','L/min'), ('9269-2','{score}'))`, 0},
		{"plausible values", `select count(*) from observations where not case loinc
			when '9279-1' then value between 8 and 40 when '59408-5' then value between 80 and 100
			when '8480-6' then value between 70 and 220 when '8462-4' then value between 40 and 130
			when '8867-4' then value between 40 and 180 when '8310-5' then value between 34.5 and 41 and round(value::numeric, 1) = value::numeric
			when '3151-8' then value between 0 and 15 when '9269-2' then value between 3 and 15 end`, 0},
		{"diastolic below systolic", `select count(*) from observations s join observations d on d.patient_id = s.patient_id
			and d.effective_at = s.effective_at and d.loinc = '8462-4' where s.loinc = '8480-6' and d.value >= s.value - 10`, 0},
		{"every observation before the anchor", `select count(*) from observations where effective_at >= '2026-11-01T00:00:00Z'
			or stored_at >= '2026-11-01T00:00:00Z'`, 0},

		{"one to three encounters per patient", `select count(*) from patients p where (select count(*) from encounters e
			where e.patient_id = p.id) not between 1 and 3`, 0},
		{"encounter classes", `select count(*) from encounters where class->>'system' <> 'http://terminology.hl7.org/CodeSystem/v3-ActCode'
			or (class->>'code', class->>'display') not in (('AMB','ambulatory'), ('IMP','inpatient encounter'), ('EMER','emergency'), ('HH','home health'))`, 0},
		{"every encounter class used", `select count(distinct class->>'code') from encounters`, 4},
		{"finished encounters end after they start", `select count(*) from encounters where not case status
			when 'finished' then (period->>'end')::timestamptz > (period->>'start')::timestamptz
			when 'in-progress' then period->>'end' is null end
			or (period->>'start')::timestamptz <> created_at or subject->>'reference' <> 'Patient/' || patient_id`, 0},
		{"one current encounter per patient", `select count(*) from patients p where (select count(*) from encounters e
			where e.patient_id = p.id and e.status = 'in-progress') <> 1`, 0},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			got := queryInt(t, pool, c.sql)
			if c.min == 0 && got != 0 {
				t.Errorf("got %d, want 0", got)
			}
			if c.min > 0 && got < c.min {
				t.Errorf("got %d, want at least %d", got, c.min)
			}
		})
	}

	t.Run("exported ids", func(t *testing.T) {
		got := queryStrings(t, pool, `select id from organizations where slug = $1`, DemoOrgSlug)
		if len(got) != 1 || got[0] != DemoOrgID {
			t.Errorf("demo-health id %v, want %s", got, DemoOrgID)
		}
		for _, c := range []struct {
			id        string
			synthetic bool
		}{{DeterioratingPatientID, true}, {StablePatientID, true}, {RealPatientID, false}} {
			n := queryInt(t, pool, `select count(*) from patients where id = $1 and org_id = $2 and synthetic = $3`, c.id, DemoOrgID, c.synthetic)
			if n != 1 {
				t.Errorf("patient %s: not in demo-health with synthetic=%v", c.id, c.synthetic)
			}
		}
	})

	t.Run("named patients' vitals", func(t *testing.T) { checkNamedPatients(t, pool) })
	t.Run("risk level matches latest NEWS2", func(t *testing.T) { checkRiskLevels(t, pool) })

	t.Run("second seed skips", func(t *testing.T) {
		again, err := Seed(t.Context(), pool, nil)
		if err != nil {
			t.Fatalf("Seed: %v", err)
		}
		if !again.Skipped || again.Organizations != 0 {
			t.Errorf("second Seed = %+v, want Skipped", again)
		}
		if n := queryInt(t, pool, "select count(*) from organizations"); n != s.Organizations {
			t.Errorf("organizations: %d after second Seed, want %d", n, s.Organizations)
		}
	})

	t.Run("deterministic", func(t *testing.T) {
		other := seeded(t)
		a, b := checksums(t, pool), checksums(t, other)
		if a != b {
			t.Errorf("two seeds differ:\n%s\n---\n%s", a, b)
		}
		golden := filepath.Join("testdata", "checksums.golden")
		if *update {
			if err := os.WriteFile(golden, []byte(a), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatalf("%v (run go test -update to create it)", err)
		}
		if a != string(want) {
			t.Errorf("demo data changed; if intended, run go test ./storage/demo -run TestSeed -update\ngot:\n%s\nwant:\n%s", a, want)
		}
	})
}

// checksums returns one line per demo table: name, row count and the MD5 of the seeded columns
// of every row in the order of its first column (its key), rendered in UTC so the session time zone does not matter.
func checksums(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	conn, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(t.Context(), "set time zone 'UTC'"); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(context.Background(), "reset time zone") //nolint:errcheck
	var b strings.Builder
	d, err := build()
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range d.tables() {
		var n int
		var sum string
		// Only the columns Seed writes, so a later migration that adds a column does not
		// change the checksum.
		err := conn.QueryRow(t.Context(), fmt.Sprintf(
			`select count(*), coalesce(md5(string_agg(row(%s)::text, E'\n' order by %s)), '') from %s`,
			strings.Join(tb.columns, ", "), tb.columns[0], tb.name)).Scan(&n, &sum)
		if err != nil {
			t.Fatalf("checksum %s: %v", tb.name, err)
		}
		fmt.Fprintf(&b, "%s %d %s\n", tb.name, n, sum)
	}
	return b.String()
}

func TestSeedConcurrent(t *testing.T) {
	pool := pgtest.New(t)
	const seeders = 3
	var (
		wg      sync.WaitGroup
		results [seeders]Summary
		errs    [seeders]error
	)
	for i := range seeders {
		wg.Go(func() { results[i], errs[i] = Seed(t.Context(), pool, nil) })
	}
	wg.Wait()
	seededBy := 0
	for i := range seeders {
		if errs[i] != nil {
			t.Errorf("seeder %d: %v", i, errs[i])
		}
		if !results[i].Skipped {
			seededBy++
		}
	}
	if seededBy != 1 {
		t.Errorf("%d seeders wrote the data, want exactly 1", seededBy)
	}
	if n := queryInt(t, pool, "select count(*) from organizations"); n != len(orgSpecs) {
		t.Errorf("organizations: %d, want %d", n, len(orgSpecs))
	}
}

// A failure in the last table must leave the database as empty as it was.
func TestSeedAtomic(t *testing.T) {
	pool := pgtest.New(t)
	_, err := pool.Exec(t.Context(), `
		create function fail_demo() returns trigger language plpgsql as $$
		begin raise exception 'injected failure'; end $$;
		create trigger fail_demo before insert on observations for each row execute function fail_demo();`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Seed(t.Context(), pool, nil)
	if err == nil || !strings.Contains(err.Error(), "injected failure") {
		t.Fatalf("Seed = %v, want the injected failure", err)
	}
	for _, table := range []string{"organizations", "publishers", "assets", "patients", "encounters", "observations"} {
		if n := queryInt(t, pool, "select count(*) from "+table); n != 0 {
			t.Errorf("%s: %d rows left after a failed seed", table, n)
		}
	}
	if _, err := pool.Exec(t.Context(), "drop trigger fail_demo on observations"); err != nil {
		t.Fatal(err)
	}
	s, err := Seed(t.Context(), pool, nil)
	if err != nil || s.Skipped {
		t.Fatalf("Seed after the failure = %+v, %v; want a full seed", s, err)
	}
}

// BenchmarkBuild measures generating the data set in memory, without the database.
func BenchmarkBuild(b *testing.B) {
	for b.Loop() {
		if _, err := build(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSeed measures a whole seed into a fresh database.
func BenchmarkSeed(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		pool := pgtest.New(b)
		b.StartTimer()
		if _, err := Seed(b.Context(), pool, nil); err != nil {
			b.Fatal(err)
		}
	}
}
