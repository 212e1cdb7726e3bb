// Package marketplace serves the asset catalogue: assets and their publishers, submissions with an
// automated compliance review (review.go), the platform operator's review decisions, deprecation,
// and installations of approved assets into projects.
//
// Visibility: an APPROVED or DEPRECATED asset is visible to every tenant; any other asset only to
// the organization that submitted it and to the platform operator. Installations belong to the
// installing organization.
//
// Every change writes its entity and its events (asset.submitted, asset.approved,
// asset.rejected, asset.deprecated, asset.installed) in one transaction.
package marketplace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/access"
	"carehub/kernel/config"
	"carehub/kernel/fault"
	"carehub/processors/internal/scoped"
	"carehub/storage"
	"carehub/storage/kafka"
)

// Asset statuses.
const (
	StatusDraft       = "DRAFT"
	StatusUnderReview = "UNDER_REVIEW"
	StatusApproved    = "APPROVED"
	StatusRejected    = "REJECTED"
	StatusDeprecated  = "DEPRECATED"
)

// Asset types.
var AssetTypes = []string{"MODEL", "AGENT", "CONNECTOR", "DATASET", "SOLUTION", "APP"}

// PricingTypes are the pricing models.
var PricingTypes = []string{"FREE", "USAGE_BASED", "SUBSCRIPTION", "ENTERPRISE"}

// Asset is a marketplace asset.
type Asset struct {
	ID               string    `db:"id"`
	PublisherID      string    `db:"publisher_id"`
	SubmittedByOrg   *string   `db:"submitted_by_org"`
	Name             string    `db:"name"`
	Description      string    `db:"description"`
	Type             string    `db:"type"`
	Category         string    `db:"category"`
	Version          string    `db:"version"`
	PricingType      string    `db:"pricing_type"`
	CostPerRequest   *float64  `db:"cost_per_request"`
	MonthlyFee       *float64  `db:"monthly_fee"`
	AnnualFee        *float64  `db:"annual_fee"`
	FreeTierLimit    *int32    `db:"free_tier_limit"`
	FHIRResources    []string  `db:"fhir_resources"`
	ScoreOverall     int       `db:"score_overall"`
	ScoreSecurity    int       `db:"score_security"`
	ScorePrivacy     int       `db:"score_privacy"`
	ScoreClinical    int       `db:"score_clinical"`
	HIPAACompliant   bool      `db:"hipaa_compliant"`
	FDACleared       bool      `db:"fda_cleared"`
	Badges           []string  `db:"badges"`
	Rating           *float64  `db:"rating"`
	Downloads        int       `db:"downloads"`
	Status           string    `db:"status"`
	Runtime          *string   `db:"runtime"` // built-in skill: news2, qsofa, vitals_trend
	DocumentationURL *string   `db:"documentation_url"`
	SupportEmail     *string   `db:"support_email"`
	ReviewNotes      *string   `db:"review_notes"`
	CreatedAt        time.Time `db:"created_at"`
	UpdatedAt        time.Time `db:"updated_at"`
}

// Publisher publishes assets.
type Publisher struct {
	ID        string    `db:"id"`
	Name      string    `db:"name"`
	Email     string    `db:"email"`
	OrgID     *string   `db:"org_id"`
	Verified  bool      `db:"verified"`
	TotalApps int       `db:"total_apps"` // listed (APPROVED or DEPRECATED) assets
	CreatedAt time.Time `db:"created_at"`
}

// Installation is an asset installed into a project.
type Installation struct {
	ID          string          `db:"id"`
	OrgID       string          `db:"org_id"`
	ProjectID   string          `db:"project_id"`
	AssetID     string          `db:"asset_id"`
	Status      string          `db:"status"`
	Config      json.RawMessage `db:"config"` // nil when none
	InstalledAt time.Time       `db:"installed_at"`
}

// Service is the marketplace. It is safe for concurrent use.
type Service struct {
	pool        *pgxpool.Pool
	eventsTopic string
	fetch       *http.Client // models fetched from a URL (AttachModelFrom)
	allowPriv   bool
}

// Config configures a Service. Zero fields take their defaults.
type Config struct {
	// EventsTopic is the topic events are written to through the outbox. Default
	// kafka.DefaultTopics().Events.
	EventsTopic string
	// AllowPrivate lets a model be fetched from loopback and private addresses (a test, or a
	// model store on premises), as webhooks may be delivered there.
	AllowPrivate bool
}

func (c *Config) defaults() { config.Default(&c.EventsTopic, kafka.DefaultTopics().Events) }

// New returns the marketplace on pool.
func New(pool *pgxpool.Pool, cfg Config) *Service {
	cfg.defaults()
	return &Service{pool: pool, eventsTopic: cfg.EventsTopic, fetch: fetchClient(cfg.AllowPrivate), allowPriv: cfg.AllowPrivate}
}

const assetColumns = `id, publisher_id, submitted_by_org, name, description, type, category, version, pricing_type,
cost_per_request, monthly_fee, annual_fee, free_tier_limit, fhir_resources, score_overall, score_security,
score_privacy, score_clinical, hipaa_compliant, fda_cleared, badges, rating, downloads, status, runtime,
documentation_url, support_email, review_notes, created_at, updated_at`

// scanAsset reads a row of assetColumns. It is what RowToStructByName would do, without the
// reflection: the catalogue listing is the API's hottest read.
func scanAsset(row pgx.CollectableRow) (Asset, error) {
	var a Asset
	err := row.Scan(&a.ID, &a.PublisherID, &a.SubmittedByOrg, &a.Name, &a.Description, &a.Type, &a.Category, &a.Version,
		&a.PricingType, &a.CostPerRequest, &a.MonthlyFee, &a.AnnualFee, &a.FreeTierLimit, &a.FHIRResources, &a.ScoreOverall,
		&a.ScoreSecurity, &a.ScorePrivacy, &a.ScoreClinical, &a.HIPAACompliant, &a.FDACleared, &a.Badges, &a.Rating,
		&a.Downloads, &a.Status, &a.Runtime, &a.DocumentationURL, &a.SupportEmail, &a.ReviewNotes, &a.CreatedAt, &a.UpdatedAt)
	return a, err
}

func scanAssetAddr(row pgx.CollectableRow) (*Asset, error) {
	a, err := scanAsset(row)
	return &a, err
}

// visible is the SQL condition of the visibility rule, with the caller's org filter as $1.
const visible = `(status in ('APPROVED', 'DEPRECATED') or $1 = '' or submitted_by_org = $1)`

// Filter selects assets; zero fields do not filter. All given filters must match.
type Filter struct {
	Type          string   // AssetType
	Category      string   // exact
	Status        string   // AssetStatus
	MinRating     *float64 // rating >= MinRating (unrated assets never match)
	Badges        []string // the asset has every one listed
	FHIRResources []string // the asset works with every one listed
	Limit, Offset int
}

// Assets returns the visible assets matching f, in one statement, newest first. Limit must be
// positive.
func (s *Service) Assets(ctx context.Context, f Filter) ([]Asset, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select `+assetColumns+` from assets where `+visible+assetFilterSQL+`
order by created_at desc, id desc limit $8 offset $9`, filterArgs(p, f, f.Limit, f.Offset)...)
	out, err := pgx.CollectRows(rows, scanAsset)
	if err != nil {
		return nil, fmt.Errorf("assets: %w", err)
	}
	return out, nil
}

// assetFilterSQL applies Filter with placeholders $2..$7; an empty value does not filter. The
// array filters use @> so the GIN indexes on badges and fhir_resources serve them.
const assetFilterSQL = `
and ($2 = '' or type = $2)
and ($3 = '' or category = $3)
and ($4 = '' or status = $4)
and ($5::double precision is null or rating >= $5)
and (cardinality($6::text[]) = 0 or badges @> $6)
and (cardinality($7::text[]) = 0 or fhir_resources @> $7)`

func filterArgs(p *access.Principal, f Filter, extra ...any) []any {
	badges, fhir := f.Badges, f.FHIRResources
	if badges == nil {
		badges = []string{}
	}
	if fhir == nil {
		fhir = []string{}
	}
	return append([]any{p.OrgFilter(), f.Type, f.Category, f.Status, f.MinRating, badges, fhir}, extra...)
}

// AssetPage is one page of a cursor-paginated asset listing.
type AssetPage struct {
	Assets     []Asset
	Total      int64
	NextCursor string
}

// ErrBadCursor is returned for a cursor this service did not produce.
var ErrBadCursor = fault.Invalid("invalid cursor: pass the meta.cursor of an earlier response unchanged")

// AssetsAfter returns up to f.Limit visible assets matching f after cursor (newest first) and
// the total number of matches. f.Offset is ignored.
func (s *Service) AssetsAfter(ctx context.Context, f Filter, cursor string) (AssetPage, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return AssetPage{}, err
	}
	at, afterID := time.Time{}, ""
	if cursor != "" {
		if at, afterID, err = storage.DecodeCursorOf(cursor, "ast_"); err != nil {
			return AssetPage{}, ErrBadCursor
		}
	}
	var page AssetPage
	batch := &pgx.Batch{}
	batch.Queue(`select `+assetColumns+` from assets where `+visible+assetFilterSQL+`
and ($8 = '' or (created_at, id) < ($9, $8))
order by created_at desc, id desc limit $10`, filterArgs(p, f, afterID, at, f.Limit+1)...).Query(func(rows pgx.Rows) error {
		var err error
		page.Assets, err = pgx.CollectRows(rows, scanAsset)
		return err
	})
	batch.Queue(`select count(*) from assets where `+visible+assetFilterSQL, filterArgs(p, f)...).QueryRow(func(row pgx.Row) error {
		return row.Scan(&page.Total)
	})
	if err := s.pool.SendBatch(ctx, batch).Close(); err != nil {
		return AssetPage{}, fmt.Errorf("assets: %w", err)
	}
	page.Assets, page.NextCursor = storage.TrimPage(page.Assets, f.Limit, func(a Asset) (time.Time, string) { return a.CreatedAt, a.ID })
	return page, nil
}

// Asset returns one visible asset.
func (s *Service) Asset(ctx context.Context, id string) (*Asset, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	return s.asset(ctx, s.pool, p, id, false)
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func (s *Service) asset(ctx context.Context, q querier, p *access.Principal, id string, lock bool) (*Asset, error) {
	sql := `select ` + assetColumns + ` from assets where ` + visible + ` and id = $2`
	if lock {
		sql += ` for update`
	}
	rows, _ := q.Query(ctx, sql, p.OrgFilter(), id)
	a, err := pgx.CollectOneRow(rows, scanAssetAddr)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound("asset", id)
	}
	if err != nil {
		return nil, fmt.Errorf("asset %s: %w", id, err)
	}
	return a, nil
}

// AssetsByID returns the visible assets among ids (a batched loader).
func (s *Service) AssetsByID(ctx context.Context, ids []string) (map[string]*Asset, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select `+assetColumns+` from assets where `+visible+` and id = any($2)`, p.OrgFilter(), ids)
	list, err := pgx.CollectRows(rows, scanAssetAddr)
	if err != nil {
		return nil, fmt.Errorf("assets by id: %w", err)
	}
	return scoped.Index(list, func(a *Asset) string { return a.ID }), nil
}

const publisherColumns = `p.id, p.name, p.email, p.org_id, p.verified, p.created_at,
(select count(*) from assets a where a.publisher_id = p.id and a.status in ('APPROVED', 'DEPRECATED'))::int as total_apps`

// Publishers returns publishers, verified ones first then by name; verified filters when non-nil.
// The catalogue's publishers are public.
func (s *Service) Publishers(ctx context.Context, verified *bool, limit int) ([]Publisher, error) {
	if _, err := access.Caller(ctx); err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select `+publisherColumns+` from publishers p
where ($1::boolean is null or p.verified = $1) order by p.verified desc, p.name, p.id limit $2`, verified, limit)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[Publisher])
	if err != nil {
		return nil, fmt.Errorf("publishers: %w", err)
	}
	return out, nil
}

// PublishersByID returns publishers by id (a batched loader).
func (s *Service) PublishersByID(ctx context.Context, ids []string) (map[string]*Publisher, error) {
	if _, err := access.Caller(ctx); err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select `+publisherColumns+` from publishers p where p.id = any($1)`, ids)
	list, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[Publisher])
	if err != nil {
		return nil, fmt.Errorf("publishers by id: %w", err)
	}
	return scoped.Index(list, func(p *Publisher) string { return p.ID }), nil
}

const installationColumns = `id, org_id, project_id, asset_id, status, config, installed_at`

// Installation returns one installation of the caller's organization.
func (s *Service) Installation(ctx context.Context, id string) (*Installation, error) {
	return scoped.One[Installation](ctx, s.pool, "installation", installationColumns, "installations", id)
}

// Installations returns the installations of a project, oldest first. A project the caller cannot
// see is NotFound.
func (s *Service) Installations(ctx context.Context, projectID string) ([]Installation, error) {
	return scoped.InProject[Installation](ctx, s.pool, installationColumns, "installations", projectID, `order by installed_at, id`)
}

// InstallationsByProject returns the installations of each project among projectIDs (a batched
// loader), oldest first.
func (s *Service) InstallationsByProject(ctx context.Context, projectIDs []string) (map[string][]Installation, error) {
	return scoped.Grouped(ctx, s.pool, installationColumns, "installations", "project_id", "project", projectIDs, "installed_at, id",
		func(in *Installation) string { return in.ProjectID })
}

// InstallationsByID returns the caller's installations among ids (a batched loader).
func (s *Service) InstallationsByID(ctx context.Context, ids []string) (map[string]*Installation, error) {
	return scoped.ByID(ctx, s.pool, installationColumns, "installations", ids, func(v *Installation) string { return v.ID })
}
