package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"carehub/kernel/access"
	"carehub/loadtest/loadcli"
)

// tenant is an organization and the keys its integration holds.
type tenant struct {
	slug    string
	keys    []string
	project string // a project id
	patient string // a patient id (pat_…)
}

// world is what the phases share: the node, the two legitimate tenants and the attacker's.
type world struct {
	n        *node
	http     *http.Client
	tenants  []*tenant
	attacker *attackerKeys
}

func setUp(ctx context.Context, n *node, c config) (*world, error) {
	w := &world{n: n, http: loadcli.HTTPClient(2*c.clients + 16)}
	for _, slug := range []string{"demo-health", "northwind-health"} {
		t := &tenant{slug: slug}
		for range c.clients {
			k, err := n.key(ctx, slug, access.Live, allScopes...)
			if err != nil {
				return nil, err
			}
			t.keys = append(t.keys, k)
		}
		var err error
		if t.project, t.patient, err = w.firstIDs(ctx, t.keys[0]); err != nil {
			return nil, fmt.Errorf("%s: %w", slug, err)
		}
		w.tenants = append(w.tenants, t)
	}
	var err error
	w.attacker, err = attackerSetUp(ctx, w)
	return w, err
}

// firstIDs returns a project and a patient of the key's organization.
func (w *world) firstIDs(ctx context.Context, key string) (project, patient string, err error) {
	var page struct {
		Data []struct{ ID string } `json:"data"`
	}
	if err := w.getJSON(ctx, key, "/v1/projects?limit=1", &page); err != nil || len(page.Data) == 0 {
		return "", "", fmt.Errorf("no project: %v", err)
	}
	project = page.Data[0].ID
	if err := w.getJSON(ctx, key, "/v1/patients?limit=1", &page); err != nil || len(page.Data) == 0 {
		return "", "", fmt.Errorf("no patient: %v", err)
	}
	return project, page.Data[0].ID, nil
}

func (w *world) getJSON(ctx context.Context, key, path string, v any) error {
	status, body, err := w.do(ctx, "GET", path, key, "", nil)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, status, body)
	}
	return json.Unmarshal(body, v)
}

// do sends one request and reads its whole answer.
func (w *world) do(ctx context.Context, method, path, key, contentType string, body []byte) (int, []byte, error) {
	req, err := httpRequest(ctx, method, w.n.url+path, key, body)
	if err != nil {
		return 0, nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := w.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return resp.StatusCode, b, err
}

func httpRequest(ctx context.Context, method, url, key string, body []byte) (*http.Request, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return nil, err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	return req, nil
}

// phase is one phase's legitimate traffic as it went.
type phase struct {
	Requests int            `json:"requests"`
	Errors   int            `json:"errors"`
	ByStatus map[string]int `json:"errorsByStatus,omitempty"`
	// Samples holds the first error answer of each call, to say what went wrong.
	Samples map[string]string `json:"errorSamples,omitempty"`
	Latency loadcli.MsDist    `json:"latencyMs"`
	// ByCall is the latency of each kind of call, to say which one an attack slows.
	ByCall map[string]loadcli.MsDist `json:"latencyMsByCall"`
	CPU    cpuUse                    `json:"cpu"`
}

// legitimate runs the tenants' traffic for c.duration, paced at c.rate a tenant.
func (w *world) legitimate(ctx context.Context, c config) phase {
	ctx, cancel := context.WithTimeout(ctx, c.duration)
	defer cancel()
	var (
		mu   sync.Mutex
		out  = phase{ByStatus: map[string]int{}, Samples: map[string]string{}}
		lats []time.Duration
		per  = map[string][]time.Duration{}
		wg   sync.WaitGroup
	)
	record := func(d time.Duration, call string, status int, body []byte, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil && ctx.Err() != nil { // cut by the phase's end, not an error of the node
			return
		}
		out.Requests++
		lats = append(lats, d)
		kind, _, _ := strings.Cut(call, "?")
		per[kind] = append(per[kind], d)
		if err != nil || status < 200 || status > 299 {
			out.Errors++
			out.ByStatus[fmt.Sprint(status)]++
			if _, ok := out.Samples[call]; !ok {
				out.Samples[call] = fmt.Sprintf("%d %.300s (%v)", status, body, err)
			}
		}
	}
	for _, t := range w.tenants {
		pace, stop := loadcli.Pace(c.rate)
		defer stop()
		for i, key := range t.keys {
			wg.Go(func() {
				for n := i; loadcli.Wait(ctx, pace); n += len(t.keys) {
					start := time.Now()
					call, status, body, err := w.legitCall(ctx, t, key, n)
					record(time.Since(start), call, status, body, err)
				}
			})
		}
	}
	wg.Wait()
	out.Latency = loadcli.Ms(lats)
	out.ByCall = map[string]loadcli.MsDist{}
	for kind, l := range per {
		out.ByCall[kind] = loadcli.Ms(l)
	}
	return out
}

// legitCall is the n-th call of a tenant's integration: what a hospital's systems do all day.
func (w *world) legitCall(ctx context.Context, t *tenant, key string, n int) (call string, status int, answer []byte, err error) {
	var (
		method, path, ctype string
		body                []byte
	)
	switch n % 6 {
	case 0:
		method, path, ctype = "POST", "/v1/events", "application/json"
		body = fmt.Appendf(nil, `{"projectId":%q,"type":"soak.legit","payload":{"n":%d,"ok":true}}`, t.project, n)
	case 1:
		method, path = "GET", "/v1/events?limit=20&projectId="+t.project
	case 2:
		method, path, ctype = "POST", "/graphql", "application/json"
		body = []byte(`{"query":"{ organizations { id name } projects(limit: 5) { id name } }"}`)
	case 3:
		method, path = "GET", "/fhir/R4/Patient?_count=5"
	case 4:
		method, path, ctype = "POST", "/v1/observations", "application/fhir+json"
		body = fmt.Appendf(nil, `{"resourceType":"Observation","status":"final",`+
			`"category":[{"coding":[{"system":"http://terminology.hl7.org/CodeSystem/observation-category","code":"vital-signs"}]}],`+
			`"code":{"coding":[{"system":"http://loinc.org","code":"8867-4","display":"Heart rate"}]},`+
			`"subject":{"reference":"Patient/%s"},"effectiveDateTime":%q,`+
			`"valueQuantity":{"value":%d,"unit":"/min","system":"http://unitsofmeasure.org","code":"/min"}}`,
			t.patient, time.Now().UTC().Format(time.RFC3339), 60+n%40)
	default:
		method, path = "GET", "/v1/patients?limit=10"
	}
	status, answer, err = w.do(ctx, method, path, key, ctype, body)
	return method + " " + path, status, answer, err
}
