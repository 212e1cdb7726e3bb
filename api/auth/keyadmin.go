package auth

import (
	"context"

	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/kernel/fault"
)

// KeyAdmin is API key management for callers of the API (REST /v1/api-keys): admin:org, the
// caller's organization only. Beyond the scope, it refuses escalation: a caller cannot obtain,
// by creating or rotating a key, a secret holding a scope the caller does not hold itself
// (INSUFFICIENT_SCOPE); a test-mode caller manages test keys only (FORBIDDEN), since a test
// credential must not lead to patient data; a JWT cannot create or rotate keys (FORBIDDEN), since
// a short-lived credential must not mint long-lived ones. Platform keys are made by the CLI only.
type KeyAdmin struct {
	keys  KeyStore
	authn *Authenticator // may be nil; told to forget rotated and revoked keys
}

// NewKeyAdmin returns key management over keys; authn (may be nil) drops its cached state of a
// key this node rotates or revokes.
func NewKeyAdmin(keys KeyStore, authn *Authenticator) *KeyAdmin {
	return &KeyAdmin{keys: keys, authn: authn}
}

// List returns the caller's organization's keys (every key for the platform operator), newest
// first, masked.
func (k *KeyAdmin) List(ctx context.Context) ([]apikeys.Key, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return nil, err
	}
	return k.keys.List(ctx, p.OrgFilter())
}

// Get returns one key of the caller's organization; another organization's is NOT_FOUND.
func (k *KeyAdmin) Get(ctx context.Context, id string) (*apikeys.Key, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return nil, err
	}
	return k.keys.Get(ctx, p.OrgFilter(), id)
}

// Create makes a key in the caller's organization. nk.OrgID may be empty or the caller's own;
// the platform operator must name the organization. nk.Platform is refused.
func (k *KeyAdmin) Create(ctx context.Context, nk apikeys.NewKey) (*apikeys.CreatedKey, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return nil, err
	}
	if nk.Platform {
		return nil, fault.New(fault.KindForbidden, "platform keys are created with the carehub keys command only")
	}
	if !p.Platform {
		if nk.OrgID != "" && nk.OrgID != p.OrgID {
			return nil, fault.NotFound("organization", nk.OrgID)
		}
		nk.OrgID = p.OrgID
	}
	if err := mayHold(p, nk.Mode, nk.Scopes); err != nil {
		return nil, err
	}
	return k.keys.Create(ctx, nk)
}

// Rotate replaces key id; the old key stays valid for apikeys.RotationGrace.
func (k *KeyAdmin) Rotate(ctx context.Context, id string) (*apikeys.CreatedKey, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return nil, err
	}
	old, err := k.keys.Get(ctx, p.OrgFilter(), id)
	if err != nil {
		return nil, err
	}
	if err := mayHold(p, old.Mode, old.Scopes); err != nil {
		return nil, err
	}
	created, err := k.keys.Rotate(ctx, p.OrgFilter(), id)
	if err != nil {
		return nil, err
	}
	k.forget(id)
	return created, nil
}

// Revoke ends key id at once, on this node and (the store announces it on
// postgres.KeyChangesChannel) on every other.
func (k *KeyAdmin) Revoke(ctx context.Context, id string) (*apikeys.Key, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return nil, err
	}
	target, err := k.keys.Get(ctx, p.OrgFilter(), id)
	if err != nil {
		return nil, err
	}
	if p.Mode == access.Test && target.Mode != access.Test {
		return nil, fault.New(fault.KindForbidden, "a test key manages test keys only")
	}
	revoked, err := k.keys.Revoke(ctx, p.OrgFilter(), id)
	if err != nil {
		return nil, err
	}
	k.forget(id)
	return revoked, nil
}

func (k *KeyAdmin) forget(id string) {
	if k.authn != nil {
		k.authn.ForgetKey(id)
	}
}

// mayHold checks that p may obtain the secret of a key of mode with scopes. A JWT may not: a
// short-lived credential must not mint long-lived ones.
func mayHold(p *access.Principal, mode string, scopes []string) error {
	if p.TokenID != "" {
		return fault.New(fault.KindForbidden, "a token cannot create or rotate API keys: present an API key")
	}
	if p.Mode == access.Test && mode != access.Test {
		return fault.New(fault.KindForbidden, "a test key manages test keys only")
	}
	for _, s := range scopes {
		if access.ValidScope(s) && !p.Has(s) {
			return fault.InsufficientScope(s)
		}
	}
	return nil
}
