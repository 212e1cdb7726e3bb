// Package ids makes carehub's identifiers: a type prefix and a lowercase ULID (DECISIONS §1), so
// ids sort by creation time and say what they name (org_, prj_, key_, pub_, ast_, ins_, dep_, agt_,
// ses_, wf_, run_, wh_, dlv_, evt_, pat_, obs_, enc_, req_, bex_).
package ids

import (
	"crypto/rand"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

// Prefixes of every identifier kind.
const (
	Organization = "org_"
	Project      = "prj_"
	APIKey       = "key_"
	Publisher    = "pub_"
	Asset        = "ast_"
	Installation = "ins_"
	Deployment   = "dep_"
	Agent        = "agt_"
	Session      = "ses_"
	Workflow     = "wf_"
	Run          = "run_"
	Webhook      = "wh_"
	Delivery     = "dlv_"
	Event        = "evt_"
	Patient      = "pat_"
	Observation  = "obs_"
	Encounter    = "enc_"
	Request      = "req_"
	Attempt      = "att_"
	Export       = "bex_"
	Subscription = "sub_" // a FHIR Subscription
)

var (
	mu      sync.Mutex
	entropy = ulid.Monotonic(rand.Reader, 0)
)

// New returns prefix + a new lowercase ULID. Ids made by one process are strictly increasing.
func New(prefix string) string {
	mu.Lock()
	id := ulid.MustNew(ulid.Timestamp(time.Now()), entropy)
	mu.Unlock()
	return withPrefix(prefix, id)
}

// withPrefix is prefix + id in lower case, in one allocation: every event and every webhook
// delivery takes an id.
func withPrefix(prefix string, id ulid.ULID) string {
	var text [ulid.EncodedSize]byte
	_ = id.MarshalTextTo(text[:]) // fails only for a shorter buffer
	for i, c := range text {
		if c >= 'A' && c <= 'Z' {
			text[i] = c + 'a' - 'A'
		}
	}
	return prefix + string(text[:])
}

// At returns prefix + a lowercase ULID for time t drawn from r. With a seeded r it is
// deterministic, which the demo data relies on.
func At(prefix string, t time.Time, r io.Reader) string {
	return withPrefix(prefix, ulid.MustNew(ulid.Timestamp(t), r))
}

// Valid reports whether id has the given prefix followed by a well-formed ULID.
func Valid(prefix, id string) bool {
	if !strings.HasPrefix(id, prefix) {
		return false
	}
	// ParseStrict reads Crockford's base32 in either case: no upper-casing copy (every consumer
	// validates the ids of every event it reads).
	_, err := ulid.ParseStrict(id[len(prefix):])
	return err == nil
}
