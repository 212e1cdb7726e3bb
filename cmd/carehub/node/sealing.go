package node

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"

	"carehub/kernel/sealing"
	"carehub/processors/webhooks"
)

// sealingKeyName is the embedded default's key file under the data dir.
const sealingKeyName = "sealing.key"

// sealingKey loads the server sealing key: the file --sealing-key-file names, which must exist
// (a production deployment gives every node the same one), or else the data dir's, made on the
// first start. The key stays out of the database, so a reader of the database opens nothing.
func (c *Config) sealingKey() (*sealing.Key, error) {
	if c.SealingKeyFile != "" {
		return sealing.Load(c.SealingKeyFile)
	}
	return sealing.LoadOrCreate(filepath.Join(c.DataDir, sealingKeyName))
}

func startSealingKey(s *Node, _, _ context.Context) error {
	k, err := s.cfg.sealingKey()
	s.sealKey = k
	return err
}

// startWebhookSecrets seals the webhook signing secrets that rows still hold in clear (stored by
// a carehub that did not seal them): SQL cannot seal, so migration 0027 leaves that to a node.
func startWebhookSecrets(s *Node, ctx, _ context.Context) error {
	n, err := webhooks.SealStoredSecrets(ctx, s.pool, s.sealKey)
	if n > 0 {
		s.logger.Info("webhook signing secrets sealed", "webhooks", n)
	}
	return err
}

// webhookRoots are the authorities webhook receivers' certificates are checked against: nil (the
// system's) unless --webhooks-ca-file adds some.
func (c *Config) webhookRoots() (*x509.CertPool, error) {
	if c.WebhooksCAFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(c.WebhooksCAFile)
	if err != nil {
		return nil, fmt.Errorf("--webhooks-ca-file: %w", err)
	}
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--webhooks-ca-file %s: no PEM certificate in it", c.WebhooksCAFile)
	}
	return roots, nil
}

func startWebhookRoots(s *Node, _, _ context.Context) error {
	roots, err := s.cfg.webhookRoots()
	s.webhookRoots = roots
	return err
}
