package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"
)

// cmdHealth asks a running node's health endpoint and exits 0 only on 200: the container
// image's HEALTHCHECK, which has no curl or shell to do it with.
func cmdHealth(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("health", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:8080/healthz", "the endpoint to ask (/healthz: the process serves; /readyz: its dependencies answer)")
	timeout := fs.Duration("timeout", 3*time.Second, "bound on the request")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
	if err != nil {
		return fmt.Errorf("--url: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("health: %s answered %s", *url, resp.Status)
	}
	fmt.Fprintln(stdout, "ok")
	return nil
}
