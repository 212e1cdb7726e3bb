// Package scoped is the tenant-scoped data access the services share. Every query here carries
// the caller's organization filter (access.Principal.OrgFilter: "" for the platform), so a row of
// another organization is never read, and an id the caller cannot see is NotFound, the same
// answer as an id that does not exist.
package scoped

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/access"
	"carehub/kernel/fault"
)

// Org is the tenancy condition on the organization filter bound to $2.
const Org = `($2 = '' or org_id = $2)`

// Querier is a pool or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// One returns the row of table with id, its columns read into T by name; a row the caller cannot
// see is fault.NotFound(resource, id).
func One[T any](ctx context.Context, q Querier, resource, columns, table, id string) (*T, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := q.Query(ctx, `select `+columns+` from `+table+` where id = $1 and `+Org, id, p.OrgFilter())
	v, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[T])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound(resource, id)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", resource, id, err)
	}
	return v, nil
}

// ByID returns the rows of table among ids that the caller can see, keyed by key (a batched
// loader); invisible or unknown ids are absent from the map.
func ByID[T any](ctx context.Context, q Querier, columns, table string, ids []string, key func(*T) string) (map[string]*T, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := q.Query(ctx, `select `+columns+` from `+table+` where id = any($1) and `+Org, ids, p.OrgFilter())
	list, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[T])
	if err != nil {
		return nil, fmt.Errorf("%s by id: %w", table, err)
	}
	return Index(list, key), nil
}

// ProjectOrg returns the organization of a project p can see; another organization's project is
// fault.NotFound("project", projectID).
func ProjectOrg(ctx context.Context, q Querier, p *access.Principal, projectID string) (string, error) {
	var orgID string
	err := q.QueryRow(ctx, `select org_id from projects where id = $1 and `+Org, projectID, p.OrgFilter()).Scan(&orgID)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fault.NotFound("project", projectID)
	}
	if err != nil {
		return "", fmt.Errorf("project %s: %w", projectID, err)
	}
	return orgID, nil
}

// ProjectOrgs remembers the organization of each project it has found, so that a publish at
// thousands a second does not pay a round trip to Postgres for a fact that cannot change: a
// project never changes organization and is never deleted. Only projects found are kept (an
// unknown id is asked again), and the caller's organization filter is applied to a remembered
// project as the query applies it. It is safe for concurrent use; the zero value is ready.
type ProjectOrgs struct {
	mu   sync.RWMutex
	orgs map[string]string
}

// maxProjectOrgs bounds a ProjectOrgs: past it, it starts over.
const maxProjectOrgs = 1 << 16

// Lookup is ProjectOrg, answered from what c remembers when it can.
func (c *ProjectOrgs) Lookup(ctx context.Context, q Querier, p *access.Principal, projectID string) (string, error) {
	c.mu.RLock()
	orgID, ok := c.orgs[projectID]
	c.mu.RUnlock()
	if ok {
		if f := p.OrgFilter(); f != "" && f != orgID {
			return "", fault.NotFound("project", projectID)
		}
		return orgID, nil
	}
	orgID, err := ProjectOrg(ctx, q, p, projectID)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	if c.orgs == nil || len(c.orgs) >= maxProjectOrgs {
		c.orgs = make(map[string]string)
	}
	c.orgs[projectID] = orgID
	c.mu.Unlock()
	return orgID, nil
}

// BatchSender is a pool (or a connection): what sends a batch in one round trip.
type BatchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// InProject returns the rows of table in project projectID that the caller can see, read into T
// by name, in one round trip with the check that the caller sees the project: a project it
// cannot see is fault.NotFound("project", projectID). rest follows `where project_id = $1 and
// Org`: more conditions, the order and the limit, with args bound from $3.
func InProject[T any](ctx context.Context, b BatchSender, columns, table, projectID, rest string, args ...any) ([]T, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	var exists bool
	var out []T
	batch := &pgx.Batch{}
	batch.Queue(`select exists(select 1 from projects where id = $1 and `+Org+`)`, projectID, p.OrgFilter()).
		QueryRow(func(row pgx.Row) error { return row.Scan(&exists) })
	batch.Queue(`select `+columns+` from `+table+` where project_id = $1 and `+Org+` `+rest,
		append([]any{projectID, p.OrgFilter()}, args...)...).Query(func(rows pgx.Rows) error {
		var err error
		out, err = pgx.CollectRows(rows, pgx.RowToStructByName[T])
		return err
	})
	if err := b.SendBatch(ctx, batch).Close(); err != nil {
		return nil, fmt.Errorf("%s of %s: %w", table, projectID, err)
	}
	if !exists {
		return nil, fault.NotFound("project", projectID)
	}
	return out, nil
}

// Grouped returns the rows of table that the caller can see whose column (project_id, org_id)
// is among keys, grouped by it with key (a batched loader); order is the order by clause within
// a group. by names the column in errors ("project").
func Grouped[T any](ctx context.Context, q Querier, columns, table, column, by string, keys []string, order string,
	key func(*T) string) (map[string][]T, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := q.Query(ctx, `select `+columns+` from `+table+` where `+column+` = any($1) and `+Org+` order by `+order, keys, p.OrgFilter())
	list, err := pgx.CollectRows(rows, pgx.RowToStructByName[T])
	if err != nil {
		return nil, fmt.Errorf("%s by %s: %w", table, by, err)
	}
	return Group(list, key), nil
}

// LatestPer returns, for each row of parent among ids that the caller can see, at most limit of
// its rows in table (those whose fk is the parent's id) in order, which names the child's
// columns as c.column ("c.started_at desc, c.id desc"): a batched loader's lateral join. what
// names the read in errors ("sessions by agent").
func LatestPer[T any](ctx context.Context, q Querier, columns, table, fk, parent, what string, ids []string, order string, limit int) ([]T, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := q.Query(ctx, `select c.* from `+parent+` p cross join lateral (
	select `+columns+` from `+table+` c where c.`+fk+` = p.id order by `+order+` limit $3
) c where p.id = any($1) and ($2 = '' or p.org_id = $2)`, ids, p.OrgFilter(), limit)
	list, err := pgx.CollectRows(rows, pgx.RowToStructByName[T])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return list, nil
}

// Group groups list by key, in list's order.
func Group[T any](list []T, key func(*T) string) map[string][]T {
	out := make(map[string][]T)
	for i := range list {
		k := key(&list[i])
		out[k] = append(out[k], list[i])
	}
	return out
}

// Index keys list by key, for the batched loaders that answer a map by id; of two items with one
// key the later wins.
func Index[T any](list []*T, key func(*T) string) map[string]*T {
	out := make(map[string]*T, len(list))
	for _, v := range list {
		out[key(v)] = v
	}
	return out
}
