package webhooks

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/events"
)

// cachedSub is what the consumer needs of a subscription to match events to it, and to know
// whether it may make their first attempts itself (fast.go).
type cachedSub struct {
	id, orgID string
	patterns  []string
	createdAt time.Time

	status   string
	settings Settings
}

// wants reports whether an event of type typ from organization orgID matches the subscription
// (an event without an organization is the platform's, which any subscription may match).
func (s cachedSub) wants(orgID, typ string) bool {
	return (orgID == "" || orgID == s.orgID) && events.MatchAny(s.patterns, typ)
}

type cacheEntry struct {
	subs     []cachedSub
	loadedAt time.Time
}

// subCache holds the subscriptions of recently seen projects that record deliveries: active,
// failing and paused ones (a paused subscription keeps collecting deliveries to send when it is
// resumed); disabled and deleted ones do not. Entries expire after ttl and are dropped at once
// when the Service announces a change (NotifyChannel).
type subCache struct {
	pool *pgxpool.Pool
	ttl  time.Duration

	mu      sync.Mutex
	entries map[string]cacheEntry
	// version counts invalidations; a load that raced one is used but not kept.
	version uint64
}

const maxCachedProjects = 10000

func newSubCache(pool *pgxpool.Pool, ttl time.Duration) *subCache {
	return &subCache{pool: pool, ttl: ttl, entries: map[string]cacheEntry{}}
}

// invalidate drops project's entry, or every entry when project is "".
func (c *subCache) invalidate(project string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.version++
	if project == "" {
		clear(c.entries)
		return
	}
	delete(c.entries, project)
}

// get returns the subscriptions of each project, loading the missing and expired ones in one
// query.
func (c *subCache) get(ctx context.Context, projects []string) (map[string][]cachedSub, error) {
	out := make(map[string][]cachedSub, len(projects))
	var missing []string
	now := time.Now()
	c.mu.Lock()
	version := c.version
	for _, p := range projects {
		if e, ok := c.entries[p]; ok && now.Sub(e.loadedAt) < c.ttl {
			out[p] = e.subs
		} else {
			missing = append(missing, p)
		}
	}
	c.mu.Unlock()
	if len(missing) == 0 {
		return out, nil
	}
	rows, err := c.pool.Query(ctx, `select id, org_id, project_id, events, created_at, status, ordered, max_in_flight,
	batch_size, rate_limit from webhooks
where project_id = any($1) and deleted_at is null and status <> 'disabled' order by created_at, id`, missing)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	loaded := make(map[string][]cachedSub, len(missing))
	for rows.Next() {
		var s cachedSub
		var project string
		if err := rows.Scan(&s.id, &s.orgID, &project, &s.patterns, &s.createdAt, &s.status,
			&s.settings.Ordered, &s.settings.MaxInFlight, &s.settings.BatchSize, &s.settings.RateLimit); err != nil {
			return nil, err
		}
		loaded[project] = append(loaded[project], s)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) > maxCachedProjects {
		clear(c.entries) // expired entries are only overwritten, so bound them
	}
	for _, p := range missing {
		out[p] = loaded[p]
		if c.version == version {
			c.entries[p] = cacheEntry{subs: loaded[p], loadedAt: now}
		}
	}
	return out, nil
}
