// Package orgs serves organizations and their projects: the tenants of carehub and the containers
// of installations, deployments, agents and workflows. Reads are filtered by the caller's
// organization (a platform operator sees all); another tenant's organization or project is
// NOT_FOUND, never FORBIDDEN, so existence does not leak.
package orgs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/processors/internal/scoped"
	"carehub/storage"
)

// Organization is a tenant: a health system, clinic, payer, developer tenant or research body.
type Organization struct {
	ID             string    `db:"id"`
	Name           string    `db:"name"`
	Slug           string    `db:"slug"`
	Type           string    `db:"type"` // health_system, clinic, payer, developer, research
	Plan           string    `db:"plan"` // starter, growth, enterprise
	FHIRBase       *string   `db:"fhir_base"`
	HIPAACompliant bool      `db:"hipaa_compliant"` // a signed BAA is on file
	MemberCount    int       `db:"member_count"`
	CreatedAt      time.Time `db:"created_at"`
}

// Project belongs to one organization.
type Project struct {
	ID        string    `db:"id"`
	OrgID     string    `db:"org_id"`
	Name      string    `db:"name"`
	CreatedAt time.Time `db:"created_at"`
}

// Service reads organizations and projects. It is safe for concurrent use.
type Service struct {
	pool *pgxpool.Pool
}

// New returns the service on pool.
func New(pool *pgxpool.Pool) *Service { return &Service{pool: pool} }

const orgColumns = `id, name, slug, type, plan, fhir_base, hipaa_compliant, member_count, created_at`

// Organization returns the organization that ref names (its id or its slug), or a NotFound fault
// when the caller cannot see it.
func (s *Service) Organization(ctx context.Context, ref string) (*Organization, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select `+orgColumns+` from organizations where id = $1 or slug = $1`, ref)
	o, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Organization])
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !p.SeesOrg(o.ID)) {
		return nil, fault.NotFound("organization", ref)
	}
	if err != nil {
		return nil, fmt.Errorf("organization %s: %w", ref, err)
	}
	return o, nil
}

// OrgID returns the id of the organization that ref names (its id or its slug), or a NotFound
// fault when there is none the caller sees: another tenant's slug is as unknown as a made-up one.
func (s *Service) OrgID(ctx context.Context, ref string) (string, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return "", err
	}
	var id string
	err = s.pool.QueryRow(ctx, `select id from organizations where id = $1 or slug = $1`, ref).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !p.SeesOrg(id)) {
		return "", fault.NotFound("organization", ref)
	}
	if err != nil {
		return "", fmt.Errorf("organization %s: %w", ref, err)
	}
	return id, nil
}

// Organizations returns a page of the organizations the caller sees, oldest first.
func (s *Service) Organizations(ctx context.Context, limit, offset int) ([]Organization, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select `+orgColumns+` from organizations
where ($1 = '' or id = $1) order by created_at, id limit $2 offset $3`, p.OrgFilter(), limit, offset)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[Organization])
	if err != nil {
		return nil, fmt.Errorf("organizations: %w", err)
	}
	return out, nil
}

// OrganizationPage is one page of a cursor-paginated organization listing.
type OrganizationPage struct {
	Organizations []Organization
	Total         int64
	NextCursor    string // "" on the last page
}

// ErrBadCursor is returned for a cursor this service did not produce.
var ErrBadCursor = fault.Invalid("invalid cursor: pass the meta.cursor of an earlier response unchanged")

// OrganizationsAfter returns up to limit organizations the caller sees after cursor (oldest
// first) and the total count. The cursor is opaque: the position of the last row of a page.
func (s *Service) OrganizationsAfter(ctx context.Context, limit int, cursor string) (OrganizationPage, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return OrganizationPage{}, err
	}
	l := listing[Organization]{table: "organizations", columns: orgColumns, filterColumn: "id", idPrefix: ids.Organization,
		key: func(o *Organization) (time.Time, string) { return o.CreatedAt, o.ID }}
	rows, total, next, err := l.after(ctx, s.pool, p.OrgFilter(), limit, cursor)
	return OrganizationPage{Organizations: rows, Total: total, NextCursor: next}, err
}

// listing is a keyset-paginated listing of a table, oldest first, filtered by one column.
type listing[T any] struct {
	table, columns, filterColumn, idPrefix string
	key                                    func(*T) (time.Time, string) // created_at and id of a row
}

// after returns up to limit rows after cursor whose filterColumn is filter ("" for all), the total
// count under the filter, and the cursor of the next page ("" on the last).
func (l listing[T]) after(ctx context.Context, pool *pgxpool.Pool, filter string, limit int, cursor string) (rows []T, total int64, next string, err error) {
	at, afterID := time.Time{}, ""
	if cursor != "" {
		if at, afterID, err = storage.DecodeCursorOf(cursor, l.idPrefix); err != nil {
			return nil, 0, "", ErrBadCursor
		}
	}
	where := `($1 = '' or ` + l.filterColumn + ` = $1)`
	batch := &pgx.Batch{}
	batch.Queue(`select `+l.columns+` from `+l.table+` where `+where+` and ($2 = '' or (created_at, id) > ($3, $2))
order by created_at, id limit $4`, filter, afterID, at, limit+1).Query(func(r pgx.Rows) error {
		rows, err = pgx.CollectRows(r, pgx.RowToStructByName[T])
		return err
	})
	batch.Queue(`select count(*) from `+l.table+` where `+where, filter).QueryRow(func(row pgx.Row) error {
		return row.Scan(&total)
	})
	if err := pool.SendBatch(ctx, batch).Close(); err != nil {
		return nil, 0, "", fmt.Errorf("%s: %w", l.table, err)
	}
	if len(rows) > limit {
		rows = rows[:limit]
		next = storage.EncodeCursor(l.key(&rows[limit-1]))
	}
	return rows, total, next, nil
}

// OrganizationsByID returns the visible organizations among ids (a batched loader); invisible or
// unknown ids are absent from the map.
func (s *Service) OrganizationsByID(ctx context.Context, ids []string) (map[string]*Organization, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select `+orgColumns+` from organizations where id = any($1) and ($2 = '' or id = $2)`,
		ids, p.OrgFilter())
	list, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[Organization])
	if err != nil {
		return nil, fmt.Errorf("organizations by id: %w", err)
	}
	return scoped.Index(list, func(o *Organization) string { return o.ID }), nil
}

const projectColumns = `id, org_id, name, created_at`

// Project returns the project with id, or NotFound when the caller cannot see it.
func (s *Service) Project(ctx context.Context, id string) (*Project, error) {
	return scoped.One[Project](ctx, s.pool, "project", projectColumns, "projects", id)
}

// Projects returns a page of the projects of the organization orgRef names (its id or its slug),
// oldest first. An organization the caller cannot see is NotFound.
func (s *Service) Projects(ctx context.Context, orgRef string, limit, offset int) ([]Project, error) {
	orgID, err := s.OrgID(ctx, orgRef)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select `+projectColumns+` from projects where org_id = $1 order by created_at, id limit $2 offset $3`,
		orgID, limit, offset)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[Project])
	if err != nil {
		return nil, fmt.Errorf("projects of %s: %w", orgID, err)
	}
	return out, nil
}

// ProjectPage is one page of a cursor-paginated project listing.
type ProjectPage struct {
	Projects   []Project
	Total      int64
	NextCursor string // "" on the last page
}

// ProjectsAfter returns up to limit projects the caller sees after cursor (oldest first) and the
// total count: those of the organization orgRef names (id or slug) when it is not empty, else
// every project the caller sees (its organization's; a platform operator's: all).
func (s *Service) ProjectsAfter(ctx context.Context, orgRef string, limit int, cursor string) (ProjectPage, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return ProjectPage{}, err
	}
	orgID := p.OrgFilter()
	if orgRef != "" {
		if orgID, err = s.OrgID(ctx, orgRef); err != nil {
			return ProjectPage{}, err
		}
	}
	l := listing[Project]{table: "projects", columns: projectColumns, filterColumn: "org_id", idPrefix: ids.Project,
		key: func(p *Project) (time.Time, string) { return p.CreatedAt, p.ID }}
	rows, total, next, err := l.after(ctx, s.pool, orgID, limit, cursor)
	return ProjectPage{Projects: rows, Total: total, NextCursor: next}, err
}

// ProjectsByOrg returns the projects of each organization among orgIDs that the caller sees, oldest
// first (a batched loader).
func (s *Service) ProjectsByOrg(ctx context.Context, orgIDs []string) (map[string][]Project, error) {
	return scoped.Grouped(ctx, s.pool, projectColumns, "projects", "org_id", "organization", orgIDs, "created_at, id",
		func(pr *Project) string { return pr.OrgID })
}

// ProjectsByID returns the visible projects among ids (a batched loader).
func (s *Service) ProjectsByID(ctx context.Context, ids []string) (map[string]*Project, error) {
	return scoped.ByID(ctx, s.pool, projectColumns, "projects", ids, func(v *Project) string { return v.ID })
}
