// Command carehub is the clinical AI platform event hub: `carehub serve` runs a node; migrate,
// seed, keys and version are operator tools. main only parses and dispatches; the node is composed
// in carehub/cmd/carehub/node.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
