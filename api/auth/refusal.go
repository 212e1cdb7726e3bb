package auth

import (
	"errors"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/kernel/config"
	"carehub/kernel/telemetry"
	"carehub/processors/audit"
	"carehub/storage"
)

// Reasons a credential is refused, as the audit log records them (AuditRecord.AuthFailure).
const (
	ReasonMissing      = "missing"       // no Authorization value
	ReasonMalformed    = "malformed"     // not "Bearer <key or token>", or shaped like neither
	ReasonUnknownKey   = "unknown_key"   // a well-formed key that does not exist
	ReasonRevoked      = "revoked"       // the key, or a JWT's parent key, is revoked
	ReasonExpired      = "expired"       // rotated past its grace, or a JWT past its exp
	ReasonInvalidToken = "invalid_token" // a JWT that does not verify or does not match its key
)

// Refusal is the error of a refused credential: the UNAUTHENTICATED fault the client sees
// (Unwrap), and what the audit log records about the attempt. It never holds the secret: a
// key is named by prefix and last four characters, as listings show it, and by id when it
// exists; a JWT only as "jwt", and by its parent key once its signature has verified (an
// unverified token's claims are the caller's word, and must not file records under another
// tenant).
type Refusal struct {
	Reason     string // one of the Reason constants
	Credential string // "chk_live_…AbCd", "jwt", or "" when the value is not shaped like either
	KeyID      string // the key (a JWT's parent), when it exists
	OrgID      string // the key's organization, when it exists; "" otherwise
	Mode       string // the key's mode, when it exists
	ClientIP   string
	err        error
}

func (r *Refusal) Error() string { return r.err.Error() }

// Unwrap returns the fault: ErrMissingCredential, ErrMalformedCredential or ErrInvalidCredential.
func (r *Refusal) Unwrap() error { return r.err }

func refuse(err error, reason, credential string, key *apikeys.Key, ip netip.Addr) *Refusal {
	r := &Refusal{Reason: reason, Credential: credential, err: err}
	if ip.IsValid() {
		r.ClientIP = ip.String()
	}
	if key != nil {
		r.KeyID, r.OrgID, r.Mode = key.ID, key.OrgID, key.Mode
		if r.Credential == "" {
			r.Credential = key.Masked
		}
	}
	return r
}

// maskKey returns a well-formed key as listings show it: prefix…last4.
func maskKey(key string) string {
	return key[:len(apikeys.LivePrefix)] + "…" + key[len(key)-4:]
}

// principalKey is the key p was authenticated with, as far as p tells.
func principalKey(p *access.Principal) *apikeys.Key {
	return &apikeys.Key{ID: p.KeyID, OrgID: p.OrgID, Mode: p.Mode}
}

// RefusalLimits bound the audit records of refused credentials. A failed authentication costs
// the caller nothing, so unbounded, a flood of bad requests would become a flood of audit
// writes: each client address (an IPv6 client by its /64, which one host commonly holds whole)
// gets a token bucket, and all of them together one more. A refusal beyond either is not
// recorded but counted (carehub_audit_auth_failures_suppressed_total). Limits are per node.
type RefusalLimits struct {
	PerSource Rate // default 1/s, burst 10
	Total     Rate // default 20/s, burst 200
	// MaxSources bounds the addresses tracked (default 10,000); past it, full buckets go first,
	// then random ones (which at worst lets one address record another burst).
	MaxSources int
}

// DefaultRefusalLimits returns the limits the server runs with.
func DefaultRefusalLimits() RefusalLimits {
	return RefusalLimits{PerSource: Rate{PerSecond: 1, Burst: 10}, Total: Rate{PerSecond: 20, Burst: 200}, MaxSources: 10_000}
}

func (l RefusalLimits) withDefaults() RefusalLimits {
	d := DefaultRefusalLimits()
	if l.PerSource.PerSecond <= 0 || l.PerSource.Burst <= 0 {
		l.PerSource = d.PerSource
	}
	if l.Total.PerSecond <= 0 || l.Total.Burst <= 0 {
		l.Total = d.Total
	}
	config.Default(&l.MaxSources, d.MaxSources)
	return l
}

// sampler decides which refused calls are recorded: each bucket (a client address, a key) gets
// RefusalLimits.PerSource and all of them together RefusalLimits.Total; a call past either is
// counted in suppressed, not recorded.
type sampler struct {
	perSource, total *limiter
	suppressed       prometheus.Counter
	recorded         prometheus.Counter // nil: not counted
}

func newSampler(l RefusalLimits, reg prometheus.Registerer, suppressed, recorded prometheus.Counter) *sampler {
	if reg != nil {
		suppressed = telemetry.Shared(reg, suppressed)
		if recorded != nil {
			recorded = telemetry.Shared(reg, recorded)
		}
	}
	return &sampler{perSource: newLimiter(l.PerSource, l.MaxSources), total: newLimiter(l.Total, 1),
		suppressed: suppressed, recorded: recorded}
}

// newRefusalSampler samples failed authentications by client address (source).
func newRefusalSampler(l RefusalLimits, reg prometheus.Registerer) *sampler {
	return newSampler(l, reg,
		prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "audit",
			Name: "auth_failures_suppressed_total", Help: "Failed authentications not audited because their client address, or all together, exceeded the failed-authentication audit rate."}),
		prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "audit",
			Name: "auth_failures_recorded_total", Help: "Failed authentications written to the audit log."}))
}

// newLimitedSampler samples a live key's calls refused by the rate limits (429), by key: the
// calls the limits let through are all recorded, and a 429 touched nothing.
func newLimitedSampler(l RefusalLimits, reg prometheus.Registerer) *sampler {
	return newSampler(l, reg,
		prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "audit",
			Name: "rate_limited_suppressed_total", Help: "Live-key calls refused by the rate limits (429) not audited because their key, or all keys together, exceeded the refused-call audit rate."}),
		nil)
}

// admit reports whether a refused call of bucket is recorded at now.
func (s *sampler) admit(bucket string, now time.Time) bool {
	if s.perSource.take(bucket, now).allowed && s.total.take("", now).allowed {
		if s.recorded != nil {
			s.recorded.Inc()
		}
		return true
	}
	s.suppressed.Inc()
	return false
}

// source is the bucket of a client address: an IPv4 address, an IPv6 /64.
func source(clientIP string) string {
	a, err := netip.ParseAddr(clientIP)
	if err != nil {
		return ""
	}
	if a = a.Unmap(); a.Is6() {
		return netip.PrefixFrom(a, 64).Masked().String()
	}
	return a.String()
}

// refusalRecord builds the record of a refused credential, or nil when the sampler drops it.
// The refusal is filed under the key's organization when the key exists (its administrators see
// attempts with their revoked or expired keys), under "" otherwise, which only the platform
// operator reads: an unknown key names no tenant, and the claims of an unverified JWT are the
// caller's word.
func (a *Auditor) refusalRecord(ref *Refusal, c audit.Call) *storage.AuditRecord {
	if !a.sampler.admit(source(ref.ClientIP), a.now()) {
		return nil
	}
	rec := c.Record(audit.Who{OrgID: ref.OrgID, KeyID: ref.KeyID, Mode: ref.Mode, ClientIP: ref.ClientIP,
		AuthFailure: ref.Reason, Credential: ref.Credential}, a.now())
	return &rec
}

// Refused records the failed authentication err describes (a *Refusal, as Authenticate returns
// it) of a call that does not pass through Middleware, such as a WebSocket's connection_init,
// as a 401. Other errors (an unavailable key store) are not refusals and are not recorded. It
// never waits for the broker.
func (a *Auditor) Refused(c audit.Call, err error) {
	var ref *Refusal
	if !errors.As(err, &ref) {
		return
	}
	if rec := a.refusalRecord(ref, c); rec != nil {
		a.sink.Publish(*rec)
	}
}
