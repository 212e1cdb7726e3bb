package marketplace

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/processors/inference/onnx"
	"carehub/processors/internal/scoped"
)

// MaxModelBytes bounds a model file.
const MaxModelBytes = 32 << 20

// FormatONNX is the one model format carehub serves itself.
const FormatONNX = "onnx"

// RuntimeONNX is the runtime of an asset that carries a model: its deployments serve the model
// on the embedded ONNX Runtime.
const RuntimeONNX = "onnx"

// ModelArtifact is the model a MODEL asset's version carries.
type ModelArtifact struct {
	AssetID    string         `json:"assetId"`
	Version    string         `json:"version"`
	SHA256     string         `json:"sha256"`
	Format     string         `json:"format"`
	SizeBytes  int64          `json:"sizeBytes"`
	Signature  ModelSignature `json:"signature"`
	AttachedAt time.Time      `json:"attachedAt"`
	// SourceURL is where carehub fetched the file from (AttachModelFrom); absent for an upload.
	SourceURL string `json:"sourceUrl,omitempty"`
}

// ModelSignature is what a model takes and gives, and its metadata (ONNX metadata_props).
type ModelSignature struct {
	Inputs   []TensorSpec      `json:"inputs"`
	Outputs  []TensorSpec      `json:"outputs"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// TensorSpec is one input or output: its name, element type ("float") and shape (-1 for a
// dimension of any size).
type TensorSpec struct {
	Name     string  `json:"name"`
	Datatype string  `json:"datatype"`
	Shape    []int64 `json:"shape"`
}

// Signature returns sig as a model artifact records it.
func Signature(sig onnx.Signature) ModelSignature {
	spec := func(ts []onnx.TensorInfo) []TensorSpec {
		out := make([]TensorSpec, len(ts))
		for i, t := range ts {
			out[i] = TensorSpec{Name: t.Name, Datatype: t.ElemType, Shape: t.Shape}
		}
		return out
	}
	return ModelSignature{Inputs: spec(sig.Inputs), Outputs: spec(sig.Outputs), Metadata: sig.Metadata}
}

// checkModel loads content on the embedded runtime and returns its signature.
func checkModel(content []byte) (ModelSignature, error) {
	if len(content) > MaxModelBytes {
		return ModelSignature{}, fault.New(fault.KindTooLarge, "a model file is at most %d MiB", MaxModelBytes>>20)
	}
	if err := onnx.Init(""); err != nil {
		return ModelSignature{}, fault.Wrap(fault.KindUnavailable, err, "the embedded ONNX Runtime is not available on this node, so the model cannot be checked; retry on a node that has it")
	}
	m, err := onnx.Load(content, 1)
	if errors.Is(err, onnx.ErrInvalidModel) {
		return ModelSignature{}, fault.Validation("the file is not a model carehub can serve", map[string]string{"model": err.Error()})
	}
	if err != nil {
		return ModelSignature{}, fmt.Errorf("check model: %w", err)
	}
	defer m.Close()
	return Signature(m.Signature()), nil
}

// AttachModel gives the caller's MODEL asset, at its current version, the ONNX model content,
// checked loadable and stored by its SHA-256. Only the organization that submitted the asset may,
// with publish:assets, and only before the review decides (UNDER_REVIEW or DRAFT): what a
// reviewer approves is what deploys. A version keeps its model: the same file again answers the
// same artifact, another is a Conflict (a new model is a new version, submitted anew). Deployments
// of the asset then serve the model on the embedded runtime. created is false when the version
// already carried this file.
func (s *Service) AttachModel(ctx context.Context, assetID string, content []byte) (_ *ModelArtifact, created bool, err error) {
	p, err := s.mayAttach(ctx, assetID)
	if err != nil {
		return nil, false, err
	}
	return s.attach(ctx, p, assetID, content, nil)
}

// mayAttach returns the caller when it may attach a model to asset assetID now: the cheap checks
// come first, so only the asset's publisher gets carehub to fetch or parse bytes.
func (s *Service) mayAttach(ctx context.Context, assetID string) (*access.Principal, error) {
	p, err := access.Require(ctx, access.PublishAssets)
	if err != nil {
		return nil, err
	}
	a, err := s.asset(ctx, s.pool, p, assetID, false)
	if err != nil {
		return nil, err
	}
	return p, attachable(p, a)
}

// attach checks content and attaches it to asset assetID's version; source is the URL it was
// fetched from, nil for an upload.
func (s *Service) attach(ctx context.Context, p *access.Principal, assetID string, content []byte, source *string) (_ *ModelArtifact, created bool, err error) {
	sig, err := checkModel(content)
	if err != nil {
		return nil, false, err
	}
	sum := sha256.Sum256(content)
	digest := hex.EncodeToString(sum[:])
	sigJSON, err := json.Marshal(sig)
	if err != nil {
		return nil, false, fmt.Errorf("attach model: %w", err)
	}
	var art *ModelArtifact
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		a, err := s.asset(ctx, tx, p, assetID, true)
		if err != nil {
			return err
		}
		if err := attachable(p, a); err != nil { // again, under the lock: a review may have decided meanwhile
			return err
		}
		if _, err := tx.Exec(ctx, `insert into model_artifacts (sha256, format, size_bytes, signature, content)
values ($1, $2, $3, $4, $5) on conflict (sha256) do nothing`, digest, FormatONNX, len(content), sigJSON, content); err != nil {
			return fmt.Errorf("store model: %w", err)
		}
		var kept string
		if err := tx.QueryRow(ctx, `insert into asset_models (asset_id, version, sha256, attached_by, source_url) values ($1, $2, $3, $4, $5)
on conflict (asset_id, version) do update set asset_id = excluded.asset_id returning sha256, xmax = 0`, a.ID, a.Version, digest, p.KeyID, source).Scan(&kept, &created); err != nil {
			return fmt.Errorf("attach model: %w", err)
		}
		if kept != digest {
			return fault.Conflict("version %s of asset %s already carries model %s; a new model is a new version", a.Version, assetID, kept)
		}
		if _, err := tx.Exec(ctx, `update assets set runtime = $2, updated_at = now() where id = $1`, a.ID, RuntimeONNX); err != nil {
			return fmt.Errorf("attach model: %w", err)
		}
		art, err = s.model(ctx, tx, a.ID)
		return err
	})
	if err != nil {
		return nil, false, fault.Context(err, "attach model")
	}
	return art, created, nil
}

// attachable says why p may not attach a model to a, or nil when it may.
func attachable(p *access.Principal, a *Asset) error {
	switch {
	case a.SubmittedByOrg == nil || *a.SubmittedByOrg != p.OrgID:
		return fault.New(fault.KindForbidden, "only the organization that submitted asset %s attaches its model", a.ID)
	case a.Type != "MODEL":
		return fault.Validation("only a MODEL asset carries a model", map[string]string{"assetId": "asset " + a.ID + " is a " + a.Type})
	case a.Status != StatusUnderReview && a.Status != StatusDraft:
		return fault.Conflict("asset %s is %s: its version %s is frozen; submit a new version to change its model", a.ID, a.Status, a.Version)
	}
	return nil
}

// Model returns the model of asset id's current version, or NotFound when the asset is not
// visible to the caller or carries no model.
func (s *Service) Model(ctx context.Context, id string) (*ModelArtifact, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := s.asset(ctx, s.pool, p, id, false); err != nil {
		return nil, err
	}
	return s.model(ctx, s.pool, id)
}

// ModelsByAsset returns the models of the current versions of the assets among ids that the
// caller sees and that carry one (a batched loader).
func (s *Service) ModelsByAsset(ctx context.Context, ids []string) (map[string]*ModelArtifact, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, modelSelect+` where `+visible+` and a.id = any($2)`, p.OrgFilter(), ids)
	list, err := pgx.CollectRows(rows, scanModel)
	if err != nil {
		return nil, fmt.Errorf("models by asset: %w", err)
	}
	return scoped.Index(list, func(m *ModelArtifact) string { return m.AssetID }), nil
}

// modelSelect reads the model of an asset's current version; visible applies to alias a.
const modelSelect = `select a.id, m.version, m.sha256, ma.format, ma.size_bytes, ma.signature, m.attached_at, coalesce(m.source_url, '')
from assets a join asset_models m on m.asset_id = a.id and m.version = a.version join model_artifacts ma on ma.sha256 = m.sha256`

func scanModel(row pgx.CollectableRow) (*ModelArtifact, error) {
	var art ModelArtifact
	var sig []byte
	if err := row.Scan(&art.AssetID, &art.Version, &art.SHA256, &art.Format, &art.SizeBytes, &sig, &art.AttachedAt, &art.SourceURL); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(sig, &art.Signature); err != nil {
		return nil, err
	}
	return &art, nil
}

// model reads the model of asset assetID's current version.
func (s *Service) model(ctx context.Context, q querier, assetID string) (*ModelArtifact, error) {
	rows, _ := q.Query(ctx, modelSelect+` where a.id = $1`, assetID)
	art, err := pgx.CollectOneRow(rows, scanModel)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound("model of asset", assetID)
	}
	if err != nil {
		return nil, fmt.Errorf("model of asset %s: %w", assetID, err)
	}
	return art, nil
}
