// Package loadcli holds what the load commands against a running node share: the loopback
// guard on their URLs, key lists, project lookup, pauses and latency summaries in milliseconds.
package loadcli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"carehub/api/pipelinetest"
)

// LoopbackURL checks that raw is an http(s) URL of a loopback host: the load tools only load a
// local node.
func LoopbackURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http(s) URL", raw)
	}
	return LoopbackHost(u.Hostname())
}

// LoopbackHost checks that host is localhost or a loopback address.
func LoopbackHost(host string) error {
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%q is not a loopback address: the load tools only load a local node", host)
	}
	return nil
}

// Keys splits a comma-separated list of API keys, dropping blanks.
func Keys(list string) []string {
	var keys []string
	for k := range strings.SplitSeq(list, ",") {
		if k = strings.TrimSpace(k); k != "" {
			keys = append(keys, k)
		}
	}
	return keys
}

// ProjectID returns project when it is an id (prj_…), else the id of the project of that name
// among those c's key sees.
func ProjectID(ctx context.Context, c *pipelinetest.Client, project string) (string, error) {
	if strings.HasPrefix(project, "prj_") {
		return project, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return c.ProjectID(ctx, project)
}

// Sleep waits d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// RandomHex returns 2n random hex digits (a run's own event types).
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// MsDist is a latency distribution in milliseconds, as the reports print it.
type MsDist struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Ms summarizes ds in milliseconds.
func Ms(ds []time.Duration) MsDist {
	d := pipelinetest.Distribute(ds)
	f := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	return MsDist{N: d.N, P50: f(d.P50), P90: f(d.P90), P99: f(d.P99), Max: f(d.Max)}
}

// String is "n=… p50=…ms p90=…ms p99=…ms max=…ms".
func (d MsDist) String() string {
	return fmt.Sprintf("n=%d p50=%.1fms p90=%.1fms p99=%.1fms max=%.1fms", d.N, d.P50, d.P90, d.P99, d.Max)
}
