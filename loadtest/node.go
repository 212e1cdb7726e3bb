package loadtest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/api/auth"
	"carehub/cmd/carehub/node"
	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/storage/demo"
	"carehub/storage/postgres"
)

// Node is a whole carehub node in process for -self runs of the API scenarios (eventload,
// subload): what `carehub serve` runs on its embedded defaults (local Postgres, durable; kfake;
// the event log in Postgres), on a loopback port, with API keys of the demo organization.
type Node struct {
	URL  string
	Keys []string // live demo-health keys with the scopes asked for
	n    *node.Node
	dir  string // removed on Close: the directory StartTempNode made
}

// StartNode starts a node with its data under dataDir and creates keys API keys with scopes;
// configure, when not nil, changes the node's configuration first. Close stops it.
func StartNode(ctx context.Context, dataDir string, keys int, logger *slog.Logger, configure func(*node.Config), scopes ...string) (*Node, error) {
	cfg := node.Defaults()
	cfg.DataDir, cfg.HTTPAddr, cfg.LogLevel, cfg.AccessLog = filepath.Join(dataDir, "node"), "127.0.0.1:0", "warn", "off"
	// The clients are one organization's keys, each held to a key's rate: the organization's
	// rate is theirs together, so the scenarios measure the pipeline at the rates they ask for.
	cfg.RatePerOrg = float64(max(keys, 1)) * auth.DefaultLimits().Default.PerSecond
	if configure != nil {
		configure(&cfg)
	}
	n, err := node.Start(ctx, cfg, logger)
	if err != nil {
		return nil, fmt.Errorf("start carehub: %w", err)
	}
	out := &Node{URL: n.URL(), n: n}
	for range keys {
		k, err := out.Key(ctx, demo.DemoOrgSlug, access.Live, scopes...)
		if err != nil {
			out.Close()
			return nil, err
		}
		out.Keys = append(out.Keys, k)
	}
	return out, nil
}

// StartTempNode is StartNode with its data in a new directory of /tmp named after prefix, which
// Close removes, and errors only in its log.
func StartTempNode(ctx context.Context, prefix string, keys int, configure func(*node.Config), scopes ...string) (*Node, error) {
	dir, err := os.MkdirTemp("/tmp", prefix)
	if err != nil {
		return nil, err
	}
	// The embedded Postgres runs as user postgres when we are root: it must traverse dir.
	if err := os.Chmod(dir, 0o755); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	n, err := StartNode(ctx, dir, keys, logger, configure, scopes...)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	n.dir = dir
	return n, nil
}

// Pool is the node's Postgres pool, for what a scenario samples of it.
func (n *Node) Pool() *pgxpool.Pool { return n.n.Pool() }

// Key creates a key of the organization slug (mode access.Live or access.Test) with scopes, as
// the CLI's keys create does.
func (n *Node) Key(ctx context.Context, slug, mode string, scopes ...string) (string, error) {
	var orgID string
	if err := n.n.Pool().QueryRow(ctx, `select id from organizations where slug = $1`, slug).Scan(&orgID); err != nil {
		return "", fmt.Errorf("organization %s: %w", slug, err)
	}
	k, err := postgres.NewAPIKeys(n.n.Pool()).Create(ctx, apikeys.NewKey{OrgID: orgID, Mode: mode, Name: "load " + slug, Scopes: scopes})
	if err != nil {
		return "", fmt.Errorf("create key: %w", err)
	}
	return k.Secret, nil
}

// Brokers returns the node's Kafka brokers (its embedded broker's address).
func (n *Node) Brokers() []string { return n.n.Brokers() }

// Close stops the node.
func (n *Node) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = n.n.Close(ctx)
	if n.dir != "" {
		_ = os.RemoveAll(n.dir)
	}
}
