package kafka_test

import (
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage/kafka"
)

// TestWatchSeesInfoLines: ClientConfig.Watch gets franz-go's info lines (publish.Transactional
// relies on one), without a Logger too.
func TestWatchSeesInfoLines(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		seen []string
	)
	cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: []string{"127.0.0.1:1"}, Watch: func(level kgo.LogLevel, msg string) {
		mu.Lock()
		defer mu.Unlock()
		if level == kgo.LogLevelInfo {
			seen = append(seen, msg)
		}
	}}, kgo.TransactionalID("watch"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	_ = cl.BeginTransaction() // no broker: it logs, then fails or begins; either is fine here
	mu.Lock()
	defer mu.Unlock()
	if len(seen) == 0 {
		t.Fatal("Watch saw no info line")
	}
}
