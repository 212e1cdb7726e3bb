package graphql_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"carehub/kernel/access"
	"carehub/storage/demo"
)

// BenchmarkAssetsQuery measures the assets query with three filters combined, through the running
// server over HTTP (authentication, GraphQL parse, validation, execution, one SQL statement),
// with concurrent clients. It reports requests per second and the p50 and p99 latency.
//
//	go test ./api/graphql -run '^$' -bench AssetsQuery -benchtime 10000x
//
// Requests rotate over many keys so that the per-credential rate limit (50/s, burst 100) is not
// what is measured.
func BenchmarkAssetsQuery(b *testing.B) {
	s := start(b)
	body, _ := json.Marshal(map[string]any{
		"query": `query($t: AssetType, $s: AssetStatus, $r: Float) { assets(type: $t, status: $s, minRating: $r, limit: 20) {
			id name type status rating downloads pricing { type } complianceScore { overall } } }`,
		"variables": map[string]any{"t": "MODEL", "s": "APPROVED", "r": 4.0},
	})
	benchGraphQL(b, s, body, []byte(`"APPROVED"`))
}

// BenchmarkPublishEvent measures single publishEvent mutations (authentication, limits, GraphQL,
// the outbox transaction with its audit record) through the running server, with concurrent
// clients: the publish path's ceiling, apart from the relay and the event log behind it.
//
//	go test ./api/graphql -run '^$' -bench PublishEvent -benchtime 20000x -cpuprofile cpu.out
func BenchmarkPublishEvent(b *testing.B) {
	s := start(b)
	body, _ := json.Marshal(map[string]any{
		"query": `mutation($type: String!, $payload: JSON!, $projectId: ID!) {
			publishEvent(type: $type, payload: $payload, projectId: $projectId) { id timestamp } }`,
		"variables": map[string]any{"type": "bench.publish", "payload": map[string]any{"seq": 1, "note": "bench"},
			"projectId": s.ProjectID(demo.SepsisProjectName)},
	})
	benchGraphQL(b, s, body, []byte(`"evt_`), access.ExecWorkflows)
}

// benchGraphQL posts body to /graphql b.N times from 8 × GOMAXPROCS goroutines, over 256 keys of
// the demo organization, and fails on any answer without want.
func benchGraphQL(b *testing.B, s *node, body, want []byte, scopes ...string) {
	keys := make([]string, 256)
	for i := range keys {
		keys[i] = "Bearer " + s.Key(demo.DemoOrgSlug, access.Live, scopes...)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 64}}
	url := s.URL + "/graphql"
	post := func(key string) (time.Duration, error) {
		req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Authorization", key)
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		d := time.Since(start)
		if resp.StatusCode != http.StatusOK || bytes.Contains(b, []byte(`"errors"`)) || !bytes.Contains(b, want) {
			return d, &badResponse{resp.StatusCode, string(b)}
		}
		return d, nil
	}
	for _, k := range keys[:8] { // warm the connections and the key cache
		if _, err := post(k); err != nil {
			b.Fatal(err)
		}
	}

	var (
		mu   sync.Mutex
		all  []time.Duration
		next atomic.Int64
		fail atomic.Value
	)
	b.SetParallelism(8) // 8 × GOMAXPROCS client goroutines
	b.ReportAllocs()
	b.ResetTimer()
	began := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			d, err := post(keys[int(next.Add(1))%len(keys)])
			if err != nil {
				fail.Store(err)
				continue
			}
			mine = append(mine, d)
		}
		mu.Lock()
		all = append(all, mine...)
		mu.Unlock()
	})
	elapsed := time.Since(began)
	b.StopTimer()
	if err, _ := fail.Load().(error); err != nil {
		b.Fatal(err)
	}
	slices.Sort(all)
	pct := func(p float64) float64 { return float64(all[int(float64(len(all)-1)*p)]) / float64(time.Millisecond) }
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "req/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

type badResponse struct {
	status int
	body   string
}

func (e *badResponse) Error() string { return http.StatusText(e.status) + ": " + e.body }
