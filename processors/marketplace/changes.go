package marketplace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/access"
	"carehub/kernel/events"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/processors/internal/scoped"
	"carehub/storage/idempotency"
	"carehub/storage/outbox"
)

// SubmissionResult is the outcome of Submit.
type SubmissionResult struct {
	ID      string
	Status  string
	Message string
	Score   Score
}

// Submit records a submission of the caller's organization as an asset UNDER_REVIEW with its
// automated compliance score (AutomatedScore), under the organization's publisher (created, not
// verified, on its first submission), and emits asset.submitted. Requires publish:assets.
func (s *Service) Submit(ctx context.Context, in Submission) (*SubmissionResult, error) {
	p, err := access.Require(ctx, access.PublishAssets)
	if err != nil {
		return nil, err
	}
	if p.OrgID == "" {
		return nil, fault.Invalid("submitting an asset needs an organization's key: the platform operator is not a publisher")
	}
	if bad := in.validate(); len(bad) > 0 {
		return nil, fault.Validation("invalid asset submission", bad)
	}
	score := AutomatedScore(in)
	fhir := in.FHIRResources
	if fhir == nil {
		fhir = []string{}
	}
	var docs *string
	if in.DocumentationURL != "" {
		docs = &in.DocumentationURL
	}
	id := ids.New(ids.Asset)
	err = idempotency.Tx(ctx, s.pool, &id, func(tx pgx.Tx) error {
		publisherID, err := s.orgPublisher(ctx, tx, p.OrgID, in.SupportEmail)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `insert into assets (id, publisher_id, submitted_by_org, name, description, type, category,
version, pricing_type, monthly_fee, fhir_resources, score_overall, score_security, score_privacy, score_clinical,
hipaa_compliant, fda_cleared, status, documentation_url, support_email)
values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, false, false, 'UNDER_REVIEW', $16, $17)`,
			id, publisherID, p.OrgID, in.Name, in.Description, in.Type, in.Category, in.Version, in.PricingType,
			in.MonthlyFee, fhir, score.Overall, score.Security, score.Privacy, score.ClinicalSafety, docs, in.SupportEmail); err != nil {
			return fmt.Errorf("insert asset: %w", err)
		}
		return s.emit(ctx, tx, events.TypeAssetSubmitted, p.OrgID, "", map[string]any{
			"assetId": id, "publisherId": publisherID, "name": in.Name, "version": in.Version, "status": StatusUnderReview,
		})
	})
	if err != nil {
		return nil, fault.Context(err, "submit asset")
	}
	return &SubmissionResult{ID: id, Status: StatusUnderReview, Score: score, Message: fmt.Sprintf(
		"Asset submitted for review. Automated compliance score %d/100 (security %d, privacy %d, clinical safety %d); a platform reviewer decides next.",
		score.Overall, score.Security, score.Privacy, score.ClinicalSafety)}, nil
}

// orgPublisher returns the publisher of orgID, creating an unverified one named after the
// organization when it has none. The organization row is locked so that two first submissions
// create one publisher.
func (s *Service) orgPublisher(ctx context.Context, tx pgx.Tx, orgID, email string) (string, error) {
	var orgName string
	if err := tx.QueryRow(ctx, `select name from organizations where id = $1 for update`, orgID).Scan(&orgName); err != nil {
		return "", fmt.Errorf("publisher organization %s: %w", orgID, err)
	}
	var id string
	err := tx.QueryRow(ctx, `select id from publishers where org_id = $1 order by created_at, id limit 1`, orgID).Scan(&id)
	if err == nil {
		return id, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("publisher of %s: %w", orgID, err)
	}
	id = ids.New(ids.Publisher)
	if _, err := tx.Exec(ctx, `insert into publishers (id, name, email, org_id, verified) values ($1, $2, $3, $4, false)`,
		id, orgName, email, orgID); err != nil {
		return "", fmt.Errorf("insert publisher: %w", err)
	}
	return id, nil
}

// Review records a platform reviewer's decision, APPROVED or REJECTED, on an asset UNDER_REVIEW
// and emits asset.approved or asset.rejected. Only the platform operator reviews.
func (s *Service) Review(ctx context.Context, assetID, decision, notes string) (*Asset, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	if !p.Platform {
		return nil, fault.New(fault.KindForbidden, "only the platform operator reviews assets")
	}
	if decision != StatusApproved && decision != StatusRejected {
		return nil, fault.Invalid("decision must be APPROVED or REJECTED, got %q", decision)
	}
	var out *Asset
	err = idempotency.Tx(ctx, s.pool, &out, func(tx pgx.Tx) error {
		a, err := s.asset(ctx, tx, p, assetID, true)
		if err != nil {
			return err
		}
		if a.Status != StatusUnderReview {
			return fault.Conflict("asset %s is %s: only an asset UNDER_REVIEW can be reviewed", assetID, a.Status)
		}
		var n *string
		if notes != "" {
			n = &notes
		}
		rows, _ := tx.Query(ctx, `update assets set status = $2, review_notes = $3, updated_at = now() where id = $1
returning `+assetColumns, assetID, decision, n)
		if out, err = pgx.CollectOneRow(rows, scanAssetAddr); err != nil {
			return fmt.Errorf("update asset: %w", err)
		}
		payload := map[string]any{"assetId": assetID, "publisherId": a.PublisherID, "status": decision}
		typ := events.TypeAssetApproved
		if decision == StatusRejected {
			typ = events.TypeAssetRejected
			if notes != "" {
				payload["reason"] = notes
			}
		} else if notes != "" {
			payload["notes"] = notes
		}
		return s.emit(ctx, tx, typ, deref(a.SubmittedByOrg), "", payload)
	})
	if err != nil {
		return nil, fault.Context(err, "review asset")
	}
	return out, nil
}

// Deprecate moves an APPROVED asset to DEPRECATED and emits asset.deprecated: installations keep
// working, new ones are refused. The platform operator, or a key of the publisher's organization
// holding publish:assets, may deprecate.
func (s *Service) Deprecate(ctx context.Context, assetID string) (*Asset, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	var out *Asset
	err = idempotency.Tx(ctx, s.pool, &out, func(tx pgx.Tx) error {
		a, err := s.asset(ctx, tx, p, assetID, true)
		if err != nil {
			return err
		}
		if !p.Platform {
			if !p.Has(access.PublishAssets) {
				return fault.InsufficientScope(access.PublishAssets)
			}
			var publisherOrg *string
			if err := tx.QueryRow(ctx, `select org_id from publishers where id = $1`, a.PublisherID).Scan(&publisherOrg); err != nil {
				return fmt.Errorf("publisher of %s: %w", assetID, err)
			}
			if publisherOrg == nil || *publisherOrg != p.OrgID {
				return fault.New(fault.KindForbidden, "only the platform operator or the asset's publisher may deprecate it")
			}
		}
		if a.Status != StatusApproved {
			return fault.Conflict("asset %s is %s: only an APPROVED asset can be deprecated", assetID, a.Status)
		}
		rows, _ := tx.Query(ctx, `update assets set status = 'DEPRECATED', updated_at = now() where id = $1 returning `+assetColumns, assetID)
		if out, err = pgx.CollectOneRow(rows, scanAssetAddr); err != nil {
			return fmt.Errorf("update asset: %w", err)
		}
		return s.emit(ctx, tx, events.TypeAssetDeprecated, deref(a.SubmittedByOrg), "", map[string]any{
			"assetId": assetID, "publisherId": a.PublisherID, "status": StatusDeprecated,
		})
	})
	if err != nil {
		return nil, fault.Context(err, "deprecate asset")
	}
	return out, nil
}

// Install installs an APPROVED asset into one of the caller's projects, counts a download and
// emits asset.installed. config is stored as given (nil stores none). Requires admin:org.
func (s *Service) Install(ctx context.Context, assetID, projectID string, config json.RawMessage) (*Installation, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return nil, err
	}
	if len(config) > 0 && (!json.Valid(config) || strings.TrimSpace(string(config)) == "null") {
		config = nil
	}
	var out *Installation
	err = idempotency.Tx(ctx, s.pool, &out, func(tx pgx.Tx) error {
		orgID, err := scoped.ProjectOrg(ctx, tx, p, projectID)
		if err != nil {
			return err
		}
		a, err := s.asset(ctx, tx, p, assetID, true)
		if err != nil {
			return err
		}
		if a.Status != StatusApproved {
			return fault.Conflict("asset %s is %s: only APPROVED assets install", assetID, a.Status)
		}
		rows, _ := tx.Query(ctx, `insert into installations (id, org_id, project_id, asset_id, status, config)
values ($1, $2, $3, $4, 'installed', $5) returning `+installationColumns, ids.New(ids.Installation), orgID, projectID, assetID, config)
		if out, err = pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Installation]); err != nil {
			return fmt.Errorf("insert installation: %w", err)
		}
		if _, err := tx.Exec(ctx, `update assets set downloads = downloads + 1 where id = $1`, assetID); err != nil {
			return fmt.Errorf("count download: %w", err)
		}
		return s.emit(ctx, tx, events.TypeAssetInstalled, orgID, projectID, map[string]any{
			"installationId": out.ID, "assetId": assetID, "projectId": projectID, "status": out.Status,
		})
	})
	if err != nil {
		return nil, fault.Context(err, "install asset")
	}
	return out, nil
}

func (s *Service) emit(ctx context.Context, tx pgx.Tx, typ, orgID, projectID string, payload any) error {
	ev, err := events.New(typ, orgID, projectID, events.SourceSystem, events.SeverityInfo, payload)
	if err != nil {
		return err
	}
	return outbox.AppendEvents(ctx, tx, s.eventsTopic, []events.Event{ev}...)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
