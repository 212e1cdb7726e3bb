package main

import (
	"context"

	"carehub/cmd/carehub/node"
	"carehub/kernel/access"
	"carehub/loadtest"
)

// selfKeys is how many keys -self creates (the workers take them in turn).
const selfKeys = 8

// selfScopes are what the keys need: patients created, observations posted, subscriptions
// created and read (read:patients and read:observations).
var selfScopes = []string{access.ReadPatients, access.WritePatients, access.ReadObservations, access.WriteObservations}

// startSelf starts the -self node: a whole carehub node in this process under a new directory
// in /tmp, removed when it closes, with WebhooksAllowPrivate set, so that rest-hook endpoints on
// loopback (this command's receiver, plain HTTP) are accepted and delivered to, and the rate
// limits lifted, since the run measures the subscriptions, not the limiter.
func startSelf(ctx context.Context) (*loadtest.Node, error) {
	return loadtest.StartTempNode(ctx, "carehub-subload-", selfKeys, func(cfg *node.Config) {
		cfg.WebhooksAllowPrivate = true
		const unlimited = 1e6
		cfg.RatePerKey, cfg.RatePerOrg, cfg.IngestRatePerKey, cfg.IngestRatePerOrg = unlimited, unlimited, unlimited, unlimited
	}, selfScopes...)
}
