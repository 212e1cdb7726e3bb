package intake

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/access"
)

// Patient lookups are cached briefly: a device posts for the same few patients again and again,
// and a request of 10,000 observations names a few hundred patients at most. A patient's
// organization and synthetic flag never change, so a found patient can be cached for long; a
// missing one only briefly, so that a patient created a moment ago is soon accepted.
const (
	patientTTL     = 5 * time.Minute
	patientMissTTL = 5 * time.Second
	patientMax     = 200_000
)

type patientEntry struct {
	exists    bool
	orgID     string
	synthetic bool
	expires   time.Time
}

// visibleTo reports whether p may write observations of the patient: same organization (or the
// platform operator) and, for a test key, a synthetic patient. Anything else is reported as not
// found, so that existence does not leak across tenants or modes.
func (e patientEntry) visibleTo(p *access.Principal) bool {
	return e.exists && p.SeesOrg(e.orgID) && (e.synthetic || p.SeesRealPatients())
}

// patientCache resolves patient ids to their organization, a batch at a time.
type patientCache struct {
	pool *pgxpool.Pool
	now  func() time.Time

	mu sync.Mutex
	m  map[string]patientEntry
}

func newPatientCache(pool *pgxpool.Pool) *patientCache {
	return &patientCache{pool: pool, now: time.Now, m: map[string]patientEntry{}}
}

// lookup returns an entry for every id in ids, querying those not cached in one statement.
func (c *patientCache) lookup(ctx context.Context, ids []string) (map[string]patientEntry, error) {
	now := c.now()
	out := make(map[string]patientEntry, len(ids))
	var missing []string
	c.mu.Lock()
	for _, id := range ids {
		if _, done := out[id]; done {
			continue
		}
		if e, ok := c.m[id]; ok && now.Before(e.expires) {
			out[id] = e
			continue
		}
		out[id] = patientEntry{}
		missing = append(missing, id)
	}
	c.mu.Unlock()
	if len(missing) == 0 {
		return out, nil
	}
	rows, _ := c.pool.Query(ctx, `select id, org_id, synthetic from patients where id = any($1)`, missing)
	var id, org string
	var synthetic bool
	_, err := pgx.ForEachRow(rows, []any{&id, &org, &synthetic}, func() error {
		out[id] = patientEntry{exists: true, orgID: org, synthetic: synthetic, expires: now.Add(patientTTL)}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("look up patients: %w", err)
	}
	c.mu.Lock()
	if len(c.m)+len(missing) > patientMax {
		clear(c.m) // crude, and rare: a cache this size is a scan of ids, not a device fleet
	}
	for _, id := range missing {
		e := out[id]
		if !e.exists {
			e.expires = now.Add(patientMissTTL)
			out[id] = e
		}
		c.m[id] = e
	}
	c.mu.Unlock()
	return out, nil
}
