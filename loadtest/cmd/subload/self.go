package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"carehub/cmd/carehub/node"
	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/storage/demo"
	"carehub/storage/postgres"
)

// selfKeys is how many keys -self creates (the workers take them in turn).
const selfKeys = 8

// selfScopes are what the keys need: patients created, observations posted, subscriptions
// created and read (read:patients and read:observations).
var selfScopes = []string{access.ReadPatients, access.WritePatients, access.ReadObservations, access.WriteObservations}

// selfNode is the -self node: a whole carehub node in this process, as loadtest.StartNode starts
// one for eventload, but with WebhooksAllowPrivate set, so that rest-hook endpoints on loopback
// (this command's receiver, plain HTTP) are accepted and delivered to. loadtest.StartNode takes
// no node.Config, hence this copy of its few lines; the rate limits are lifted too, since the
// run measures the subscriptions, not the limiter.
type selfNode struct {
	URL  string
	Keys []string
	n    *node.Node
	dir  string
}

// startSelf starts the node under a new directory in /tmp, removed when it closes.
func startSelf(ctx context.Context) (*selfNode, error) {
	dir, err := os.MkdirTemp("/tmp", "carehub-subload-")
	if err != nil {
		return nil, err
	}
	// The embedded Postgres runs as user postgres when we are root: it must traverse dir.
	if err := os.Chmod(dir, 0o755); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	cfg := node.Defaults()
	cfg.DataDir, cfg.HTTPAddr, cfg.LogLevel, cfg.AccessLog = filepath.Join(dir, "node"), "127.0.0.1:0", "warn", "off"
	cfg.WebhooksAllowPrivate = true
	const unlimited = 1e6
	cfg.RatePerKey, cfg.RatePerOrg, cfg.IngestRatePerKey, cfg.IngestRatePerOrg = unlimited, unlimited, unlimited, unlimited
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	n, err := node.Start(ctx, cfg, logger)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start carehub: %w", err)
	}
	s := &selfNode{URL: n.URL(), n: n, dir: dir}
	var orgID string
	if err := n.Pool().QueryRow(ctx, `select id from organizations where slug = $1`, demo.DemoOrgSlug).Scan(&orgID); err != nil {
		s.Close()
		return nil, fmt.Errorf("organization %s: %w", demo.DemoOrgSlug, err)
	}
	for range selfKeys {
		k, err := postgres.NewAPIKeys(n.Pool()).Create(ctx, apikeys.NewKey{OrgID: orgID, Mode: access.Live, Name: "subload", Scopes: selfScopes})
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("create key: %w", err)
		}
		s.Keys = append(s.Keys, k.Secret)
	}
	return s, nil
}

// Close stops the node and removes its data.
func (s *selfNode) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = s.n.Close(ctx)
	_ = os.RemoveAll(s.dir)
}
