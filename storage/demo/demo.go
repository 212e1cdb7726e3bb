// Package demo seeds a database with deterministic demo data: organizations of every type with
// their projects, a marketplace catalogue, installations, agents and workflows in the demo
// tenant, and synthetic FHIR patients with encounters and three days of vital signs.
//
// The data is reproducible byte for byte: ids are ULIDs drawn from fixed PCG streams, and every
// timestamp is fixed relative to Anchor (2026-11-01T00:00:00Z), not to the time of seeding. The
// catalogue is created in the year before Anchor; each patient has a reading of eight LOINC vital
// signs every 4 hours over the 68 hours that end up to two hours before Anchor. Skills that read
// a patient's latest vitals therefore see the same values on every machine and every day; a
// consumer that rejects vitals by wall-clock age would find them all stale.
//
// Each patient's latest vitals fall in the NEWS2 band of its risk_level: low 0–2 with no single
// parameter scoring 3, moderate 3–4 or a single 3, high 5–6, critical 7 or more.
package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Names and ids other packages' tests can rely on.
const (
	// DemoOrgSlug is the slug of the main demo tenant, a health system; it is the first
	// organization created and holds most patients.
	DemoOrgSlug = "demo-health"
	// DemoOrgID is the id of the demo-health organization.
	DemoOrgID = "org_01k65840e0be59pf06zhktwqg0"

	// DeterioratingPatientID is a synthetic demo-health inpatient (risk_level critical) whose
	// latest vitals are RR 26/min, SpO2 91 % on room air, SBP 95 mm[Hg], DBP 58, HR 118/min,
	// temperature 38.6 Cel and GCS 15: NEWS2 11, qSOFA 2. Earlier readings rise from normal.
	DeterioratingPatientID = "pat_01ke5zfvg0yrnbhjm3vk8tvmc8"
	// StablePatientID is a synthetic demo-health patient monitored at home (risk_level low)
	// whose latest vitals are RR 16, SpO2 97 on room air, SBP 124, DBP 78, HR 72, temperature
	// 36.8, GCS 15: NEWS2 0.
	StablePatientID = "pat_01ke9nk500cmm0mhj9psxg961n"
	// RealPatientID is a demo-health patient with synthetic = false, standing for a real
	// patient that test-mode keys must not see. Its name is as fictional as the others'.
	RealPatientID = "pat_01kf3fm8c0xbzcfajp6n9d2emj"
)

// Names of catalogue entries, fixed so tests can find them.
const (
	NEWS2ModelName       = "NEWS2 Early Warning Score" // MODEL, runtime news2
	NEWS2AgentName       = "Deterioration Watch Agent" // AGENT, runtime news2
	QSOFAModelName       = "qSOFA Sepsis Screen"       // MODEL, runtime qsofa
	QSOFAAgentName       = "Sepsis Sentinel Agent"     // AGENT, runtime qsofa
	VitalsTrendAgentName = "Vitals Trend Summarizer"   // AGENT, runtime vitals_trend
	// DeteriorationModelName is the MODEL whose version carries a real model (runtime onnx):
	// models.Deterioration, installed in the Sepsis Early Warning project.
	DeteriorationModelName = "Deterioration Risk (synthetic demo)"

	SepsisProjectName = "Sepsis Early Warning"      // demo-health project with the agent and workflow below
	RPMProjectName    = "Remote Patient Monitoring" // demo-health project
	// Ward7AgentName is the demo-health agent (skill news2, run_mode sync) built on the
	// installed NEWS2AgentName asset.
	Ward7AgentName = "Ward 7 Deterioration Agent"
	// DeteriorationWorkflowName is the ACTIVE demo-health workflow with steps load_patient,
	// latest_vitals, score_news2, assess_risk, create_alert.
	DeteriorationWorkflowName = "Deterioration alert"
)

// Anchor is the fixed "now" of the demo data: every timestamp lies before it.
func Anchor() time.Time { return time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC) }

// lockKey is the transaction-level advisory lock that serializes concurrent seeders; an
// arbitrary constant no other carehub lock uses.
const lockKey int64 = 0x0ca4e4b0de705eed

// Summary reports what Seed wrote: row counts per table, or Skipped when data was present.
type Summary struct {
	Skipped       bool
	Organizations int
	Projects      int
	Publishers    int
	Assets        int
	Installations int
	Agents        int
	Workflows     int
	Patients      int
	Encounters    int
	Observations  int
	// Elapsed is how long a seed that wrote the data took; zero when skipped.
	Elapsed time.Duration
}

// Seed writes the demo data when the organizations table is empty and otherwise returns
// Summary{Skipped: true}. Everything is written in one transaction, so a failure leaves nothing
// behind; concurrent callers are serialized by an advisory lock, and all but the first skip.
// The schema must already be migrated. logger may be nil.
func Seed(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (Summary, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	// A cheap look before building ~30 000 rows; the authoritative check is under the lock.
	if has, err := hasOrganizations(ctx, pool); err != nil {
		return Summary{}, err
	} else if has {
		logger.InfoContext(ctx, "demo data present, seed skipped")
		return Summary{Skipped: true}, nil
	}
	d, err := build()
	if err != nil {
		return Summary{}, fmt.Errorf("build demo data: %w", err)
	}
	logger.DebugContext(ctx, "demo data built", "elapsed_ms", time.Since(start).Milliseconds())

	tx, err := pool.Begin(ctx)
	if err != nil {
		return Summary{}, fmt.Errorf("seed demo data: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, "select pg_advisory_xact_lock($1)", lockKey); err != nil {
		return Summary{}, fmt.Errorf("seed demo data: lock: %w", err)
	}
	if has, err := hasOrganizations(ctx, tx); err != nil {
		return Summary{}, err
	} else if has {
		logger.InfoContext(ctx, "demo data present, seed skipped")
		return Summary{Skipped: true}, nil
	}
	for _, t := range d.tables() {
		if t.err != nil {
			return Summary{}, t.err
		}
		copyStart := time.Now()
		n, err := tx.CopyFrom(ctx, pgx.Identifier{t.name}, t.columns, pgx.CopyFromRows(t.rows))
		if err != nil {
			return Summary{}, fmt.Errorf("seed demo data: copy %s: %w", t.name, err)
		}
		if int(n) != len(t.rows) {
			return Summary{}, fmt.Errorf("seed demo data: copy %s: wrote %d of %d rows", t.name, n, len(t.rows))
		}
		logger.DebugContext(ctx, "demo table copied", "table", t.name, "rows", n, "elapsed_ms", time.Since(copyStart).Milliseconds())
	}
	commitStart := time.Now()
	if err := tx.Commit(ctx); err != nil {
		return Summary{}, fmt.Errorf("seed demo data: commit: %w", err)
	}

	logger.DebugContext(ctx, "demo data committed", "elapsed_ms", time.Since(commitStart).Milliseconds())
	s := d.summary()
	s.Elapsed = time.Since(start)
	logger.InfoContext(ctx, "demo data seeded",
		"organizations", s.Organizations, "projects", s.Projects, "publishers", s.Publishers,
		"assets", s.Assets, "installations", s.Installations, "agents", s.Agents, "workflows", s.Workflows,
		"patients", s.Patients, "encounters", s.Encounters, "observations", s.Observations,
		"elapsed_ms", s.Elapsed.Milliseconds())
	return s, nil
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func hasOrganizations(ctx context.Context, q querier) (bool, error) {
	var has bool
	if err := q.QueryRow(ctx, "select exists (select 1 from organizations)").Scan(&has); err != nil {
		return false, fmt.Errorf("seed demo data: check organizations: %w", err)
	}
	return has, nil
}

// table is the rows of one table, in COPY column order.
type table struct {
	name    string
	columns []string
	rows    [][]any
	err     error
}

func newTable(name string, columns ...string) table { return table{name: name, columns: columns} }

func (t *table) add(values ...any) {
	if len(values) != len(t.columns) && t.err == nil {
		t.err = fmt.Errorf("demo table %s: row %d has %d values for %d columns", t.name, len(t.rows), len(values), len(t.columns))
	}
	t.rows = append(t.rows, values)
}

// dataset is the whole demo data set, built in memory before anything is written.
type dataset struct {
	organizations, projects, publishers, assets, installations, agents, workflows table
	modelArtifacts, assetModels                                                   table
	patientsT, encounters, observations                                           table

	orgID          map[string]string // slug → id
	projectID      map[string]string // "slug/project name" → id
	publisherID    map[string]string // name → id
	assetID        map[string]string // name → id
	assetStatus    map[string]string // name → status
	installationID map[string]string // "slug/project name/asset name" → id

	deterioratingID, stableID, realID string
}

func build() (*dataset, error) {
	d := &dataset{
		organizations: newTable("organizations", "id", "name", "slug", "type", "plan", "fhir_base", "hipaa_compliant", "member_count", "created_at"),
		projects:      newTable("projects", "id", "org_id", "name", "created_at"),
		publishers:    newTable("publishers", "id", "name", "email", "org_id", "verified", "created_at"),
		assets: newTable("assets", "id", "publisher_id", "submitted_by_org", "name", "description", "type", "category", "version",
			"pricing_type", "cost_per_request", "monthly_fee", "annual_fee", "free_tier_limit", "fhir_resources",
			"score_overall", "score_security", "score_privacy", "score_clinical", "hipaa_compliant", "fda_cleared", "badges",
			"rating", "downloads", "status", "runtime", "documentation_url", "support_email", "review_notes", "created_at", "updated_at"),
		modelArtifacts: newTable("model_artifacts", "sha256", "format", "size_bytes", "signature", "content", "created_at"),
		assetModels:    newTable("asset_models", "asset_id", "version", "sha256", "attached_by", "attached_at"),
		installations:  newTable("installations", "id", "org_id", "project_id", "asset_id", "status", "config", "installed_at"),
		agents:         newTable("agents", "id", "org_id", "project_id", "name", "description", "run_mode", "status", "skill", "installation_id", "created_at"),
		workflows:      newTable("workflows", "id", "org_id", "project_id", "name", "description", "status", "steps", "triggers", "created_at", "updated_at"),
		patientsT: newTable("patients", "id", "org_id", "synthetic", "name", "gender", "birth_date", "address", "telecom",
			"risk_level", "programs", "resource", "created_at", "updated_at"),
		encounters: newTable("encounters", "id", "org_id", "patient_id", "status", "class", "subject", "period", "created_at"),
		observations: newTable("observations", "id", "org_id", "patient_id", "status", "code", "loinc", "subject", "value", "unit",
			"effective_at", "device_type", "resource", "received_at", "stored_at"),
		orgID: map[string]string{}, projectID: map[string]string{}, publisherID: map[string]string{},
		assetID: map[string]string{}, assetStatus: map[string]string{}, installationID: map[string]string{},
	}
	if err := d.catalogue(); err != nil {
		return nil, err
	}
	if err := d.patients(); err != nil {
		return nil, err
	}
	// The exported ids are constants so other packages can use them anywhere; they must be what
	// the generator makes.
	var errs []error
	for _, c := range []struct{ name, got, want string }{
		{"DemoOrgID", d.orgID[DemoOrgSlug], DemoOrgID},
		{"DeterioratingPatientID", d.deterioratingID, DeterioratingPatientID},
		{"StablePatientID", d.stableID, StablePatientID},
		{"RealPatientID", d.realID, RealPatientID},
	} {
		if c.got != c.want {
			errs = append(errs, fmt.Errorf("%s is %s but the generator makes %s", c.name, c.want, c.got))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return d, nil
}

// tables lists the tables in insertion (foreign key) order.
func (d *dataset) tables() []*table {
	return []*table{&d.organizations, &d.projects, &d.publishers, &d.assets, &d.modelArtifacts, &d.assetModels, &d.installations, &d.agents,
		&d.workflows, &d.patientsT, &d.encounters, &d.observations}
}

func (d *dataset) summary() Summary {
	return Summary{
		Organizations: len(d.organizations.rows), Projects: len(d.projects.rows), Publishers: len(d.publishers.rows),
		Assets: len(d.assets.rows), Installations: len(d.installations.rows), Agents: len(d.agents.rows),
		Workflows: len(d.workflows.rows), Patients: len(d.patientsT.rows), Encounters: len(d.encounters.rows),
		Observations: len(d.observations.rows),
	}
}
