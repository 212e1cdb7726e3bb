// Package scoped is the tenant-scoped data access the services share. Every query here carries
// the caller's organization filter (access.Principal.OrgFilter: "" for the platform), so a row of
// another organization is never read, and an id the caller cannot see is NotFound, the same
// answer as an id that does not exist.
package scoped

import (
	"context"
	"errors"
	"fmt"

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
	out := make(map[string]*T, len(list))
	for _, v := range list {
		out[key(v)] = v
	}
	return out, nil
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
