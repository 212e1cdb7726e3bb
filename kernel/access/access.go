// Package access carries the caller's identity through a request and answers the two questions
// every service asks before it touches data: may this caller do this (scopes), and which
// organization's rows may it see (tenancy). The transports (REST, GraphQL, WebSocket) establish the
// Principal once; the services check it, so no transport can skip a check.
package access

import (
	"context"
	"slices"
	"time"

	"carehub/kernel/fault"
)

// Scope names of the spec's scope table.
const (
	ReadPatients      = "read:patients"
	WritePatients     = "write:patients"
	ReadObservations  = "read:observations"
	WriteObservations = "write:observations"
	ExecAgents        = "exec:agents"
	ExecWorkflows     = "exec:workflows"
	AdminOrg          = "admin:org"
	AdminBilling      = "admin:billing"
	PublishAssets     = "publish:assets"
)

// Scopes lists every scope in the order of the spec's table.
var Scopes = []string{ReadPatients, WritePatients, ReadObservations, WriteObservations, ExecAgents,
	ExecWorkflows, AdminOrg, AdminBilling, PublishAssets}

// ValidScope reports whether s is a scope of the spec's table.
func ValidScope(s string) bool { return slices.Contains(Scopes, s) }

// Modes of a credential: live keys reach real patients and are audited; test keys see only
// synthetic patients.
const (
	Live = "live"
	Test = "test"
)

// Principal is an authenticated caller.
type Principal struct {
	OrgID    string   // empty only for the platform operator
	KeyID    string   // the API key, or the JWT's parent key
	Mode     string   // Live or Test
	Scopes   []string // granted scopes
	Platform bool     // the platform operator sees every organization and holds every scope
	TokenID  string   // jti when the caller presented a JWT
	ClientIP string
	// ExpiresAt is when the credential stops authenticating by itself (a JWT's exp, a rotated
	// key's end of grace); zero when it does not. Revocation can end it any time before.
	ExpiresAt time.Time
}

// Has reports whether p holds scope.
func (p *Principal) Has(scope string) bool {
	return p.Platform || slices.Contains(p.Scopes, scope)
}

// SeesOrg reports whether p may see rows of organization orgID.
func (p *Principal) SeesOrg(orgID string) bool {
	return p.Platform || (p.OrgID != "" && p.OrgID == orgID)
}

// SeesRealPatients reports whether p may see patients that are not synthetic.
func (p *Principal) SeesRealPatients() bool { return p.Mode == Live }

type ctxKey struct{}

// With returns ctx carrying p.
func With(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// From returns the principal in ctx, or nil.
func From(ctx context.Context) *Principal {
	p, _ := ctx.Value(ctxKey{}).(*Principal)
	return p
}

// Caller returns the principal in ctx, or an Unauthenticated fault when there is none.
func Caller(ctx context.Context) (*Principal, error) {
	if p := From(ctx); p != nil {
		return p, nil
	}
	return nil, fault.Unauthenticated("a credential is required")
}

// Require returns the principal in ctx when it holds every scope listed; otherwise an
// Unauthenticated or InsufficientScope fault.
func Require(ctx context.Context, scopes ...string) (*Principal, error) {
	p, err := Caller(ctx)
	if err != nil {
		return nil, err
	}
	for _, s := range scopes {
		if !p.Has(s) {
			return nil, fault.InsufficientScope(s)
		}
	}
	return p, nil
}

// OrgFilter returns the organization id to filter by, or "" for the platform operator (all).
func (p *Principal) OrgFilter() string {
	if p.Platform {
		return ""
	}
	return p.OrgID
}
