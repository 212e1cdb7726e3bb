package loadtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
)

// Names of the carehub metrics the scenario reads.
const (
	metricStored         = "carehub_observations_stored_total"
	metricAcceptToStored = "carehub_observations_accept_to_stored_seconds"
)

// snapshot is what one scrape of the processors' /metrics says about stored observations.
type snapshot struct {
	stored  float64
	buckets map[float64]float64 // cumulative counts by upper bound (le), +Inf included
}

// scrape reads the Prometheus text exposition of every url and sums the metrics the scenario
// needs (several processors nodes each export their share).
func scrape(ctx context.Context, client *http.Client, urls []string) (snapshot, error) {
	s := snapshot{buckets: map[float64]float64{}}
	for _, u := range urls {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return s, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return s, fmt.Errorf("scrape %s: %w", u, err)
		}
		err = parseExposition(resp.Body, &s)
		resp.Body.Close()
		if err != nil {
			return s, fmt.Errorf("scrape %s: %w", u, err)
		}
	}
	return s, nil
}

// parseExposition adds the lines of the two metrics to s. It understands exactly the text
// format lines it needs: "name value" and "name_bucket{le=\"x\"} value".
func parseExposition(r io.Reader, s *snapshot) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		labels := ""
		if i := strings.IndexByte(line, '{'); i >= 0 && strings.IndexByte(line, '}') > i {
			j := strings.IndexByte(line, '}')
			name, labels, rest = line[:i], line[i+1:j], strings.TrimSpace(line[j+1:])
		}
		valueText, _, _ := strings.Cut(rest, " ")
		switch name {
		case metricStored:
			v, err := strconv.ParseFloat(valueText, 64)
			if err != nil {
				return err
			}
			s.stored += v
		case metricAcceptToStored + "_bucket":
			le := labelValue(labels, "le")
			bound, err := strconv.ParseFloat(le, 64)
			if le == "+Inf" {
				bound, err = math.Inf(1), nil
			}
			if err != nil {
				return fmt.Errorf("bucket bound %q: %w", le, err)
			}
			v, err := strconv.ParseFloat(valueText, 64)
			if err != nil {
				return err
			}
			s.buckets[bound] += v
		}
	}
	return sc.Err()
}

func labelValue(labels, name string) string {
	for part := range strings.SplitSeq(labels, ",") {
		k, v, ok := strings.Cut(part, "=")
		if ok && strings.TrimSpace(k) == name {
			return strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	return ""
}

// quantile estimates the q-quantile of the observations between two snapshots of a
// histogram, interpolating linearly inside the bucket (as PromQL's histogram_quantile). Past
// the last finite bucket it returns that bucket's bound and capped.
func quantile(q float64, before, after map[float64]float64) (v float64, capped bool) {
	bounds := make([]float64, 0, len(after))
	for b := range after {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	if len(bounds) == 0 {
		return math.NaN(), false
	}
	total := after[bounds[len(bounds)-1]] - before[bounds[len(bounds)-1]]
	if total <= 0 {
		return math.NaN(), false
	}
	rank := q * total
	prevBound, prevCount := 0.0, 0.0
	for _, b := range bounds {
		c := after[b] - before[b]
		if c >= rank {
			if math.IsInf(b, 1) {
				return prevBound, true
			}
			if c == prevCount {
				return b, false
			}
			return prevBound + (b-prevBound)*(rank-prevCount)/(c-prevCount), false
		}
		prevBound, prevCount = b, c
	}
	return bounds[len(bounds)-1], false
}
