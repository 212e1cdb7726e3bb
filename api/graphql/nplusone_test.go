package graphql_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/api/graphql"
	"carehub/kernel/access"
	"carehub/kernel/ids"
	"carehub/processors/agents"
	"carehub/processors/deployments"
	"carehub/processors/feed"
	"carehub/processors/marketplace"
	"carehub/processors/orgs"
	"carehub/processors/patients"
	"carehub/processors/webhooks"
	"carehub/processors/workflows"
	"carehub/storage/demo"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

// statementCounter counts the statements a pool sends on behalf of a counted request (one whose
// context carries countedKey), batched ones included. Background workers share the pool, and what
// they send, whenever they happen to run, is not the query's cost.
type statementCounter struct{ n atomic.Int64 }

type countedKey struct{}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	if ctx.Value(countedKey{}) != nil {
		c.n.Add(1)
	}
	return ctx
}
func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (c *statementCounter) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchQueryData) {
	if ctx.Value(countedKey{}) != nil {
		c.n.Add(1)
	}
}
func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestNoNPlusOne counts the statements of deeply nested queries over 1 and over 20 organizations:
// the batched loaders must bound the count by the query's shape, whatever the number of items.
func TestNoNPlusOne(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtest.NewDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	counter := &statementCounter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := demo.Seed(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	addOrganizations(t, pool, 10) // the demo has 10; 20 in all

	agentSvc := agents.New(pool, agents.Config{})
	t.Cleanup(func() { agentSvc.Close() })
	h, err := graphql.New(graphql.Services{Orgs: orgs.New(pool), Marketplace: marketplace.New(pool, marketplace.Config{}), Deployments: deployments.New(pool, deployments.Config{}),
		Agents: agentSvc, Workflows: workflows.New(pool, workflows.Config{}), Patients: patients.New(pool), Feed: feed.New(pool, postgres.NewEventLog(pool), feed.Config{}),
		Webhooks: webhooks.NewService(pool, webhooks.ServiceConfig{})}, graphql.Config{MaxCost: 1 << 40}) // the fan-out is wider than the default budget, on purpose
	if err != nil {
		t.Fatal(err)
	}
	platform := access.With(context.WithValue(ctx, countedKey{}, true), &access.Principal{Platform: true, Mode: access.Live, KeyID: "key_test"})

	run := func(query string) (statements int64, data string) {
		t.Helper()
		before := counter.n.Load()
		res := h.Execute(platform, graphql.Request{Query: query})
		if len(res.Errors) > 0 {
			t.Fatalf("errors: %+v", res.Errors)
		}
		return counter.n.Load() - before, string(res.Data)
	}

	for _, tc := range []struct {
		name, query string
		max         int64
	}{
		{"organizations projects assets asset publisher organization", `{ organizations(limit: %d) { id projects { id assets { id asset { id publisher { id organization { id slug } } } } } } }`, 6},
		{"projects with every nested list", `{ organizations(limit: %d) { projects { organization { id } deployments { id installation { id asset { id } } project { id } }
			workflows { id runs { id workflow { id } } project { id } } assets { project { id } } } } }`, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			one, small := run(fmt.Sprintf(tc.query, 1))
			twenty, big := run(fmt.Sprintf(tc.query, 20))
			if len(big) <= len(small) {
				t.Fatalf("the 20-organization answer (%d bytes) is not larger than the 1-organization one (%d bytes)", len(big), len(small))
			}
			// Nested lists resolve in parallel, so how the hinted keys fall into batches varies
			// by a statement or two from run to run; what must not vary is the bound, whatever
			// the number of items.
			if one == 0 || one > tc.max || twenty > tc.max {
				t.Fatalf("statements: %d for 1 organization, %d for 20 (at most %d expected for both)", one, twenty, tc.max)
			}
			t.Logf("%d statements for 1 organization, %d for 20", one, twenty)
		})
	}

	t.Run("patients with observations and encounters", func(t *testing.T) {
		q := `{ patients(limit: %d) { id observations(limit: 5) { id } encounters { id } } }`
		one, _ := run(fmt.Sprintf(q, 1))
		many, _ := run(fmt.Sprintf(q, 100))
		if one == 0 || one > 3 || many > 3 {
			t.Fatalf("statements: %d for 1 patient, %d for 100", one, many)
		}
	})
}

// addOrganizations adds n organizations, each with a project that has the NEWS2 model installed.
func addOrganizations(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	ctx := context.Background()
	var asset string
	if err := pool.QueryRow(ctx, `select id from assets where name = $1`, demo.NEWS2ModelName).Scan(&asset); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		org, prj := ids.New(ids.Organization), ids.New(ids.Project)
		created := time.Now().Add(time.Duration(i) * time.Second)
		if _, err := pool.Exec(ctx, `insert into organizations (id, name, slug, type, plan, created_at) values ($1, $2, $3, 'clinic', 'starter', $4)`,
			org, fmt.Sprintf("Extra Clinic %d", i), fmt.Sprintf("extra-clinic-%d", i), created); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `insert into projects (id, org_id, name) values ($1, $2, 'Main')`, prj, org); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `insert into installations (id, org_id, project_id, asset_id) values ($1, $2, $3, $4)`,
			ids.New(ids.Installation), org, prj, asset); err != nil {
			t.Fatal(err)
		}
	}
}
