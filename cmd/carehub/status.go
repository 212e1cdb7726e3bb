package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"carehub/api/server"
)

// errNotReady makes `carehub status` exit 1 after printing a node that is not ready, so a
// script can act on it as on `carehub health`.
var errNotReady = errors.New("not ready")

// cmdStatus prints one screen about a running node: its roles, each dependency's check (what a
// failing one degrades), its consumer groups' lags and its recent errors, all from one
// /readyz?verbose=true.
func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	base := fs.String("url", "http://127.0.0.1:8080", "the node's base URL")
	asJSON := fs.Bool("json", false, "print /readyz?verbose=true's JSON as it is")
	timeout := fs.Duration("timeout", 5*time.Second, "bound on the request")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("status: unexpected argument %q", fs.Arg(0))
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	url := strings.TrimRight(*base, "/") + "/readyz?verbose=true"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("--url: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	var st struct {
		Status string `json:"status"`
		server.Ready
	}
	if err := json.Unmarshal(body, &st); err != nil || st.Checks == nil {
		return fmt.Errorf("status: %s answered %s, not a carehub node's /readyz", url, resp.Status)
	}
	if *asJSON {
		_, _ = stdout.Write(body)
		if len(body) > 0 && body[len(body)-1] != '\n' {
			fmt.Fprintln(stdout)
		}
	} else {
		printStatus(stdout, *base, st.Status, st.Ready)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status: %s is %w (HTTP %d)", *base, errNotReady, resp.StatusCode)
	}
	return nil
}

func printStatus(w io.Writer, base, status string, rd server.Ready) {
	fmt.Fprintf(w, "carehub at %s: %s\n", base, status)
	fmt.Fprintf(w, "roles: %s\n\n", strings.Join(rd.Roles, ", "))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEPENDENCY\tSTATE\tDEGRADES")
	for _, name := range slices.Sorted(maps.Keys(rd.Checks)) {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", name, rd.Checks[name], rd.Degrades[name])
	}
	_ = tw.Flush()
	if len(rd.Consumers) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "CONSUMER\tGROUP\tLAG\tPARTITIONS HELD")
		for _, c := range rd.Consumers {
			lag := fmt.Sprint(c.Lag)
			if c.Err != "" {
				lag = "unknown: " + c.Err
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d of %d\n", c.Name, c.Group, lag, c.Assigned, c.Partitions)
		}
		_ = tw.Flush()
	}
	fmt.Fprintln(w)
	if len(rd.RecentErrors) == 0 {
		fmt.Fprintln(w, "recent errors: none")
		return
	}
	fmt.Fprintf(w, "recent errors (last %d, oldest first):\n", len(rd.RecentErrors))
	for _, e := range rd.RecentErrors {
		line := e.Time.Local().Format("15:04:05") + " " + e.Message
		for _, k := range slices.Sorted(maps.Keys(e.Attrs)) {
			line += fmt.Sprintf(" %s=%s", k, e.Attrs[k])
		}
		fmt.Fprintln(w, " ", line)
	}
}
