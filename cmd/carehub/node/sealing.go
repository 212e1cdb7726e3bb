package node

import (
	"context"
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
