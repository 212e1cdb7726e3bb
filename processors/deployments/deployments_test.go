package deployments_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/processors/deployments"
	"carehub/storage/demo"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const base = "https://carehub.test"

type fixture struct {
	t       testing.TB
	pool    *pgxpool.Pool
	svc     *deployments.Service
	ctx     context.Context // live demo-health admin with every scope
	project string
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	pool := pgtest.New(t)
	if _, err := demo.Seed(context.Background(), pool, nil); err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, pool: pool, svc: deployments.New(pool, deployments.Config{}),
		ctx: access.With(context.Background(), &access.Principal{OrgID: demo.DemoOrgID, KeyID: "key_test", Mode: access.Live, Scopes: access.Scopes})}
	f.project = f.scalar(`select id from projects where name = $1`, demo.SepsisProjectName)
	return f
}

func (f *fixture) scalar(sql string, args ...any) string {
	return pgtest.Scalar[string](f.t, f.pool, sql, args...)
}

// install returns an installation of the named asset in the Sepsis project (installing it when
// the demo data has none).
func (f *fixture) install(assetName string) string {
	f.t.Helper()
	var id string
	err := f.pool.QueryRow(context.Background(), `select i.id from installations i join assets a on a.id = i.asset_id
where i.project_id = $1 and a.name = $2 limit 1`, f.project, assetName).Scan(&id)
	if err == nil {
		return id
	}
	id = ids.New(ids.Installation)
	if _, err := f.pool.Exec(context.Background(), `insert into installations (id, org_id, project_id, asset_id)
select $1, $2, $3, id from assets where name = $4`, id, demo.DemoOrgID, f.project, assetName); err != nil {
		f.t.Fatal(err)
	}
	return id
}

func (f *fixture) deploy(installation string, replicas int, hipaa bool) *deployments.Deployment {
	f.t.Helper()
	d, err := f.svc.Create(f.ctx, installation, deployments.Spec{Environment: "production", Replicas: &replicas, HIPAAMode: hipaa})
	if err != nil {
		f.t.Fatalf("create deployment: %v", err)
	}
	return d
}

func (f *fixture) get(id string) *deployments.Deployment {
	f.t.Helper()
	d, err := f.svc.Deployment(f.ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return d
}

func (f *fixture) controller(baseURL func() string) *deployments.Controller {
	f.t.Helper()
	c, err := f.svc.Controller(deployments.ControllerConfig{BaseURL: baseURL, MinInvocations: 20})
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func (f *fixture) reconcile(c *deployments.Controller) int {
	f.t.Helper()
	n, err := c.Reconcile(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

// transitions lists "from→to" of the deployment.status_changed events of deployment id, in order.
func (f *fixture) transitions(id string) []string {
	f.t.Helper()
	rows, _ := f.pool.Query(context.Background(), `select (value->'payload'->>'from') || '→' || (value->'payload'->>'to') from outbox
where value->>'type' = 'deployment.status_changed' and value->'payload'->>'deploymentId' = $1 order by seq`, id)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		f.t.Fatal(err)
	}
	return out
}

// plainAsset is an approved demo asset without a built-in runtime.
func (f *fixture) plainAsset() string {
	return f.scalar(`select name from assets where status = 'APPROVED' and runtime is null order by id limit 1`)
}

// TestControllerStartsPending: a deployment of a runtime asset goes RUNNING with its endpoint; an
// asset without a runtime goes RUNNING without one; one that cannot serve goes FAILED with the
// reason; nothing moves until the base URL is known; every move is an event.
func TestControllerStartsPending(t *testing.T) {
	f := newFixture(t)
	serving := f.deploy(f.install(demo.NEWS2ModelName), 2, true)
	plain := f.deploy(f.install(f.plainAsset()), 1, false)
	lostBAA := f.deploy(f.install(demo.QSOFAModelName), 1, true)
	unknown := f.deploy(f.install(demo.QSOFAAgentName), 1, false)
	if _, err := f.pool.Exec(f.ctx, `update assets set runtime = 'astrology' where name = $1`, demo.QSOFAAgentName); err != nil {
		t.Fatal(err)
	}

	url := ""
	c := f.controller(func() string { return url })
	if n := f.reconcile(c); n != 0 || f.get(serving.ID).Status != deployments.StatusPending {
		t.Fatalf("moved %d deployments without a base URL", n)
	}
	// The organization's BAA lapses between createDeployment and the start.
	if _, err := f.pool.Exec(f.ctx, `update organizations set hipaa_compliant = false where id = $1`, demo.DemoOrgID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(f.ctx, `update deployments set hipaa_mode = false where id = $1`, serving.ID); err != nil {
		t.Fatal(err)
	}
	url = base + "/"
	if n := f.reconcile(c); n != 4 {
		t.Fatalf("reconcile moved %d, want 4", n)
	}
	d := f.get(serving.ID)
	if d.Status != deployments.StatusRunning || d.Endpoint == nil || *d.Endpoint != base+"/v1/deployments/"+serving.ID+"/invoke" ||
		!strings.Contains(*d.StatusReason, "news2 with 2 replica") {
		t.Fatalf("serving deployment %+v", d)
	}
	if d := f.get(plain.ID); d.Status != deployments.StatusRunning || d.Endpoint != nil || !strings.Contains(*d.StatusReason, "no built-in runtime") {
		t.Fatalf("plain deployment %+v", d)
	}
	if d := f.get(lostBAA.ID); d.Status != deployments.StatusFailed || d.Endpoint != nil || !strings.Contains(*d.StatusReason, "business associate") {
		t.Fatalf("deployment after the BAA lapsed %+v", d)
	}
	if d := f.get(unknown.ID); d.Status != deployments.StatusFailed || !strings.Contains(*d.StatusReason, `"astrology"`) {
		t.Fatalf("unknown runtime %+v", d)
	}
	if got := f.transitions(serving.ID); !slices.Equal(got, []string{"→PENDING", "PENDING→RUNNING"}) {
		t.Fatalf("events %v", got)
	}
	if got := f.transitions(lostBAA.ID); !slices.Equal(got, []string{"→PENDING", "PENDING→FAILED"}) {
		t.Fatalf("events %v", got)
	}
	if n := f.reconcile(c); n != 0 {
		t.Fatalf("a second pass moved %d", n)
	}
	if _, err := f.svc.Stop(f.ctx, lostBAA.ID); fault.KindOf(err) != fault.KindConflict {
		t.Fatalf("stopping a FAILED deployment: %v", err)
	}
}

// TestControllerDegradesAndRecovers: failed invocations over the threshold in the window make a
// deployment DEGRADED, few invocations never do, and it is RUNNING again once failures fall
// below the recovery ratio.
func TestControllerDegradesAndRecovers(t *testing.T) {
	f := newFixture(t)
	d := f.deploy(f.install(demo.NEWS2ModelName), 1, false)
	c := f.controller(func() string { return base })
	f.reconcile(c)
	add := func(ok, failed int, age time.Duration) {
		t.Helper()
		if _, err := f.pool.Exec(f.ctx, `insert into deployment_invocations (deployment_id, bucket, node_id, succeeded, failed)
values ($1, now() - make_interval(secs => $2), $3, $4, $5)`, d.ID, age.Seconds(), "node_"+time.Now().Format("150405.000000"), ok, failed); err != nil {
			t.Fatal(err)
		}
	}
	add(2, 15, 0) // 17 invocations: fewer than MinInvocations
	if f.reconcile(c); f.get(d.ID).Status != deployments.StatusRunning {
		t.Fatal("degraded on too few invocations")
	}
	add(3, 10, 5*time.Second) // 30 in the window, 25 failed
	f.reconcile(c)
	got := f.get(d.ID)
	if got.Status != deployments.StatusDegraded || !strings.Contains(*got.StatusReason, "25 of 30") || got.Endpoint == nil {
		t.Fatalf("after failures %+v", got)
	}
	// The failures age out of the window; what remains is healthy.
	if _, err := f.pool.Exec(f.ctx, `update deployment_invocations set bucket = bucket - interval '2 minutes' where deployment_id = $1`, d.ID); err != nil {
		t.Fatal(err)
	}
	add(40, 1, 0)
	f.reconcile(c)
	if got := f.get(d.ID); got.Status != deployments.StatusRunning || !strings.HasPrefix(*got.StatusReason, "recovered") {
		t.Fatalf("after recovery %+v", got)
	}
	if got := f.transitions(d.ID); !slices.Equal(got, []string{"→PENDING", "PENDING→RUNNING", "RUNNING→DEGRADED", "DEGRADED→RUNNING"}) {
		t.Fatalf("events %v", got)
	}
}

// TestControllersMoveEachDeploymentOnce: controllers of several nodes reconciling at once make
// each transition exactly once.
func TestControllersMoveEachDeploymentOnce(t *testing.T) {
	f := newFixture(t)
	ins := f.install(demo.NEWS2ModelName)
	var ids []string
	for range 20 {
		ids = append(ids, f.deploy(ins, 1, false).ID)
	}
	var wg sync.WaitGroup
	for range 4 {
		c := f.controller(func() string { return base })
		wg.Go(func() {
			for range 5 {
				if _, err := c.Reconcile(context.Background()); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		if got := f.transitions(id); !slices.Equal(got, []string{"→PENDING", "PENDING→RUNNING"}) {
			t.Fatalf("deployment %s events %v", id, got)
		}
	}
}

// TestInvoke: a RUNNING deployment scores a patient's stored vitals or given ones; it refuses what
// it cannot score, other tenants, test keys on real patients, and deployments that do not serve.
func TestInvoke(t *testing.T) {
	f := newFixture(t)
	d := f.deploy(f.install(demo.NEWS2ModelName), 2, false)
	pending := f.deploy(f.install(demo.NEWS2ModelName), 1, false)
	plain := f.deploy(f.install(f.plainAsset()), 1, false)
	c := f.controller(func() string { return base })
	f.reconcile(c)
	if _, err := f.pool.Exec(f.ctx, `update deployments set status = 'PENDING', endpoint = null where id = $1`, pending.ID); err != nil {
		t.Fatal(err)
	}
	inv := f.svc.Invoker(deployments.InvokerConfig{CacheTTL: time.Millisecond})

	res, err := inv.Invoke(f.ctx, d.ID, deployments.InvokeRequest{PatientID: demo.DeterioratingPatientID})
	if err != nil {
		t.Fatal(err)
	}
	if res.Runtime != "news2" || res.Output == nil || res.Output.Score == nil || *res.Output.Score != 11 || res.TokensUsed <= 0 ||
		len(res.Output.ObservationIDs) != 7 {
		t.Fatalf("patient invocation %+v", res)
	}
	// The deteriorating patient's latest vitals, given by value: the same score, no observation ids.
	vitals := map[string]json.RawMessage{"respiratory_rate": raw(`26`), "spo2": raw(`91`), "oxygen_flow": raw(`0`),
		"8480-6": raw(`{"value": 95, "unit": "mmHg"}`), "heart_rate": raw(`118`), "gcs": raw(`15`), "temperature": raw(`{"value": 38.6, "unit": "Cel"}`)}
	res, err = inv.Invoke(f.ctx, d.ID, deployments.InvokeRequest{Vitals: vitals})
	if err != nil {
		t.Fatal(err)
	}
	if *res.Output.Score != 11 || len(res.Output.ObservationIDs) != 0 || res.Output.Band != "high" {
		t.Fatalf("vitals invocation %+v", res.Output)
	}
	delete(vitals, "temperature")
	_, err = inv.Invoke(f.ctx, d.ID, deployments.InvokeRequest{Vitals: vitals})
	if fe := fault.As(err); fe == nil || fe.Kind != fault.KindValidation || !strings.Contains(fe.Details["fields"].(map[string]any)["vitals"].(string), "temperature") {
		t.Fatalf("missing temperature: %v", err)
	}
	testCtx := access.With(context.Background(), &access.Principal{OrgID: demo.DemoOrgID, Mode: access.Test, Scopes: access.Scopes})
	other := access.With(context.Background(), &access.Principal{OrgID: f.scalar(`select id from organizations where slug = 'northwind-health'`),
		Mode: access.Live, Scopes: access.Scopes})
	noScope := access.With(context.Background(), &access.Principal{OrgID: demo.DemoOrgID, Mode: access.Live, Scopes: []string{access.ReadPatients}})
	for _, tc := range []struct {
		name string
		ctx  context.Context
		id   string
		req  deployments.InvokeRequest
		kind fault.Kind
	}{
		{"both inputs", f.ctx, d.ID, deployments.InvokeRequest{PatientID: demo.StablePatientID, Vitals: vitals}, fault.KindValidation},
		{"no input", f.ctx, d.ID, deployments.InvokeRequest{}, fault.KindValidation},
		{"unknown vital", f.ctx, d.ID, deployments.InvokeRequest{Vitals: map[string]json.RawMessage{"mood": raw(`3`)}}, fault.KindValidation},
		{"bad options", f.ctx, d.ID, deployments.InvokeRequest{PatientID: demo.StablePatientID, Input: raw(`{"spo2Scale": 7}`)}, fault.KindValidation},
		{"unknown patient", f.ctx, d.ID, deployments.InvokeRequest{PatientID: "pat_01aaaaaaaaaaaaaaaaaaaaaaaa"}, fault.KindNotFound},
		{"test key, real patient", testCtx, d.ID, deployments.InvokeRequest{PatientID: demo.RealPatientID}, fault.KindNotFound},
		{"another tenant", other, d.ID, deployments.InvokeRequest{PatientID: demo.StablePatientID}, fault.KindNotFound},
		{"no exec:agents", noScope, d.ID, deployments.InvokeRequest{PatientID: demo.StablePatientID}, fault.KindInsufficientScope},
		{"pending", f.ctx, pending.ID, deployments.InvokeRequest{PatientID: demo.StablePatientID}, fault.KindUnavailable},
		{"no runtime", f.ctx, plain.ID, deployments.InvokeRequest{PatientID: demo.StablePatientID}, fault.KindConflict},
		{"unknown deployment", f.ctx, "dep_01aaaaaaaaaaaaaaaaaaaaaaaa", deployments.InvokeRequest{PatientID: demo.StablePatientID}, fault.KindNotFound},
	} {
		if _, err := inv.Invoke(tc.ctx, tc.id, tc.req); fault.KindOf(err) != tc.kind {
			t.Errorf("%s: %v, want kind %d", tc.name, err, tc.kind)
		}
	}
	if _, err := inv.Invoke(testCtx, d.ID, deployments.InvokeRequest{PatientID: demo.StablePatientID}); err != nil {
		t.Fatalf("test key on a synthetic patient: %v", err)
	}
	if _, err := f.svc.Stop(f.ctx, d.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // past the cache TTL
	if _, err := inv.Invoke(f.ctx, d.ID, deployments.InvokeRequest{PatientID: demo.StablePatientID}); fault.KindOf(err) != fault.KindConflict {
		t.Fatalf("stopped deployment: %v", err)
	}
	// Invocations that reached a replica count as succeeded, those refused for their data included
	// (missing temperature, unknown and real patients): 6. Requests refused before (bad request,
	// other tenant, stopped) do not count, and nothing failed.
	if err := inv.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	var ok, failed int
	if err := f.pool.QueryRow(f.ctx, `select coalesce(sum(succeeded), 0), coalesce(sum(failed), 0) from deployment_invocations where deployment_id = $1`,
		d.ID).Scan(&ok, &failed); err != nil {
		t.Fatal(err)
	}
	if ok != 6 || failed != 0 {
		t.Fatalf("counted %d ok, %d failed; want 6 and 0", ok, failed)
	}
}

func raw(s string) json.RawMessage { return json.RawMessage(s) }

// TestInvokeOverload: with every replica busy a request waits QueueWait and is refused; with the
// queue full it is refused at once; refusals count as failed invocations.
func TestInvokeOverload(t *testing.T) {
	f := newFixture(t)
	d := f.deploy(f.install(demo.NEWS2ModelName), 1, false)
	f.reconcile(f.controller(func() string { return base }))
	inv := f.svc.Invoker(deployments.InvokerConfig{QueueWait: 200 * time.Millisecond, QueuePerReplica: 1})
	// Hold the only replica: the first invocation's observation read waits for this lock.
	tx, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, `lock table observations in access exclusive mode`); err != nil {
		t.Fatal(err)
	}
	held := make(chan error, 1)
	go func() {
		_, err := inv.Invoke(f.ctx, d.ID, deployments.InvokeRequest{PatientID: demo.StablePatientID})
		held <- err
	}()
	// The first request holds the replica once its observation read waits for the lock.
	for deadline := time.Now().Add(30 * time.Second); ; {
		var waiting int
		if err := f.pool.QueryRow(f.ctx, `select count(*) from pg_locks where relation = 'observations'::regclass and not granted`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first invocation never reached the locked table")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Of the next two, one takes the only place in the queue and is refused after QueueWait; the
	// other finds the queue full and is refused at once. Either order ends the same way.
	queued := make(chan error, 1)
	go func() {
		_, err := inv.Invoke(f.ctx, d.ID, deployments.InvokeRequest{PatientID: demo.StablePatientID})
		queued <- err
	}()
	_, err = inv.Invoke(f.ctx, d.ID, deployments.InvokeRequest{PatientID: demo.StablePatientID})
	if !errors.Is(err, deployments.ErrOverloaded) || fault.KindOf(err) != fault.KindUnavailable {
		t.Fatalf("with the replica busy: %v", err)
	}
	if err := <-queued; !errors.Is(err, deployments.ErrOverloaded) {
		t.Fatalf("with the replica busy: %v", err)
	}
	if err := tx.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-held; err != nil {
		t.Fatalf("the request holding the replica: %v", err)
	}
	if err := inv.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	var ok, failed int
	if err := f.pool.QueryRow(f.ctx, `select sum(succeeded), sum(failed) from deployment_invocations where deployment_id = $1`, d.ID).Scan(&ok, &failed); err != nil {
		t.Fatal(err)
	}
	if ok != 1 || failed != 2 {
		t.Fatalf("counted %d ok, %d failed; want 1 and 2", ok, failed)
	}
}
