package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"carehub/api/ws/wstest"
)

const subscribeQuery = `subscription($p: ID!, $t: [String!]) {
  eventStream(projectId: $p, types: $t) { id type source severity projectId timestamp payload redacted }
}`

// cmdSubscribe follows a project's events over GraphQL eventStream (graphql-transport-ws) and
// prints each as one JSON line: the shell's way to a subscription, which curl cannot open. The
// key comes from CAREHUB_KEY only, never a flag, so it stays out of the process list.
//
// A script that starts it in the background and then makes the events (the README tour) waits
// for --ready-file: it is written once a ping sent after the subscribe is answered, and the
// server answers that ping only when it holds the subscription (api/ws).
func cmdSubscribe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("subscribe", flag.ContinueOnError)
	base := fs.String("url", "http://127.0.0.1:8080", "carehub base URL (http:// or https://)")
	project := fs.String("project", "", "project id (list your projects with GET /v1/projects)")
	types := fs.String("types", "", "comma-separated event types (default: every type)")
	count := fs.Int("count", 0, "exit after this many events (0: until interrupted)")
	timeout := fs.Duration("timeout", 0, "fail when --count events have not arrived within this (0: no bound)")
	readyFile := fs.String("ready-file", "", "write this file once the server holds the subscription: events from then on are printed")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	key := os.Getenv("CAREHUB_KEY")
	switch {
	case *project == "":
		return errors.New("subscribe: --project is required (list your projects with GET /v1/projects)")
	case key == "":
		return errors.New("subscribe: set CAREHUB_KEY to an API key")
	case !strings.HasPrefix(*base, "http://") && !strings.HasPrefix(*base, "https://"):
		return fmt.Errorf("subscribe: --url %q: must start with http:// or https://", *base)
	}
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	ws, err := wstest.Dial(ctx, "ws"+strings.TrimPrefix(strings.TrimSuffix(*base, "/"), "http")+"/graphql", "Bearer "+key)
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	defer ws.Close()
	vars := map[string]any{"p": *project}
	if t := splitList(*types); len(t) > 0 {
		vars["t"] = t
	}
	stream, err := ws.Subscribe(ctx, "events", subscribeQuery, vars)
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	if *readyFile != "" {
		if err := ws.Ping(ctx); err != nil {
			return fmt.Errorf("subscribe: %w", err)
		}
		if err := os.WriteFile(*readyFile, []byte("subscribed\n"), 0o644); err != nil {
			return fmt.Errorf("subscribe: --ready-file: %w", err)
		}
	}
	enc := json.NewEncoder(stdout)
	for n := 0; *count == 0 || n < *count; n++ {
		select {
		case msg, ok := <-stream:
			if !ok {
				return fmt.Errorf("subscribe: the subscription ended: %v", ws.Err("events"))
			}
			var res struct {
				Data struct {
					EventStream json.RawMessage `json:"eventStream"`
				} `json:"data"`
			}
			if err := json.Unmarshal(msg, &res); err != nil || res.Data.EventStream == nil {
				return fmt.Errorf("subscribe: unexpected result %s", msg)
			}
			if err := enc.Encode(res.Data.EventStream); err != nil {
				return err
			}
		case <-ctx.Done():
			if *count > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("subscribe: %d of %d events within %s", n, *count, *timeout)
			}
			return nil // interrupted, or the end of an unbounded --timeout watch
		}
	}
	return nil
}
