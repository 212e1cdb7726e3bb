// Package pipelinetest proves the event pipeline's acceptance end to end, black-box: an event
// published with the GraphQL mutation publishEvent goes into the Postgres outbox in the
// mutation's transaction, the relay (ingest/outbox) produces it to carehub.events.v1, the event
// log writer group (processors/eventlog) stores it, and GET /v1/events serves it.
//
// The tests drive a whole node only through its public HTTP API: an in-process node
// (e2e/servertest) for latency and broker outages, the carehub binary for a SIGKILL in the
// middle of a load. Client, the small API client they use, is exported for the load generator
// loadtest/cmd/eventload, which measures the same path under load.
package pipelinetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"carehub/kernel/tick"
)

// Client calls one carehub node with one API key. It is safe for concurrent use.
type Client struct {
	BaseURL string       // http://host:port, no trailing slash
	Key     string       // API key (or JWT) sent as a bearer token
	HTTP    *http.Client // default http.DefaultClient
}

// StatusError is a response that carried no result: a non-200 HTTP status, or a GraphQL error.
type StatusError struct {
	Status     int           // HTTP status
	Code       string        // error code (REST error.code or GraphQL extensions.code), if any
	RetryAfter time.Duration // from Retry-After on 429 and 503
	Body       string        // trimmed response body
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("HTTP %d %s: %s", e.Status, e.Code, e.Body)
}

// RateLimited reports whether err is a 429 answer: the call was refused before it ran.
func RateLimited(err error) (time.Duration, bool) {
	var se *StatusError
	if errors.As(err, &se) && se.Status == http.StatusTooManyRequests {
		return se.RetryAfter, true
	}
	return 0, false
}

// Event is an event as GET /v1/events returns it.
type Event struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	ProjectID string          `json:"projectId"`
	Source    string          `json:"source"`
	Severity  string          `json:"severity"`
	Payload   json.RawMessage `json:"payload"`
	CreatedAt time.Time       `json:"createdAt"`
}

// Published is what publishEvent answered.
type Published struct {
	ID        string
	Timestamp time.Time // the event's createdAt
}

const publishMutation = `mutation($type: String!, $payload: JSON!, $projectId: ID!) {
  publishEvent(type: $type, payload: $payload, projectId: $projectId) { id timestamp }
}`

// Publish publishes one event through GraphQL publishEvent. An error means the call did not
// report success: a *StatusError when the server answered, a transport error otherwise (then
// the event may or may not have been written).
func (c *Client) Publish(ctx context.Context, projectID, typ string, payload any) (Published, error) {
	var data struct {
		PublishEvent struct {
			ID        string    `json:"id"`
			Timestamp time.Time `json:"timestamp"`
		} `json:"publishEvent"`
	}
	err := c.GraphQL(ctx, publishMutation, map[string]any{"type": typ, "payload": payload, "projectId": projectID}, &data)
	if err != nil {
		return Published{}, err
	}
	if data.PublishEvent.ID == "" {
		return Published{}, errors.New("publishEvent returned no id")
	}
	return Published{ID: data.PublishEvent.ID, Timestamp: data.PublishEvent.Timestamp}, nil
}

// Draft is one event of a PublishBatch call.
type Draft struct {
	Type    string
	Payload any
}

// PublishBatch publishes drafts into projectID with one POST /v1/events (an array: all or
// nothing) and returns what it answered for each, in order. Errors are as Publish's.
func (c *Client) PublishBatch(ctx context.Context, projectID string, drafts []Draft) ([]Published, error) {
	type item struct {
		ProjectID string `json:"projectId"`
		Type      string `json:"type"`
		Payload   any    `json:"payload"`
	}
	items := make([]item, len(drafts))
	for i, d := range drafts {
		items[i] = item{ProjectID: projectID, Type: d.Type, Payload: d.Payload}
	}
	body, err := json.Marshal(items)
	if err != nil {
		return nil, err
	}
	// Only each event's id and time are read: the events themselves need not come back.
	b, err := c.do(ctx, http.MethodPost, "/v1/events", body, "Prefer", "return=minimal")
	if err != nil {
		return nil, err
	}
	var resp struct {
		Data []struct {
			ID        string    `json:"id"`
			CreatedAt time.Time `json:"createdAt"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &resp); err != nil {
		return nil, fmt.Errorf("decode POST /v1/events: %w", err)
	}
	if len(resp.Data) != len(drafts) {
		return nil, fmt.Errorf("POST /v1/events answered %d events for %d", len(resp.Data), len(drafts))
	}
	out := make([]Published, len(drafts))
	for i, d := range resp.Data {
		out[i] = Published{ID: d.ID, Timestamp: d.CreatedAt}
	}
	return out, nil
}

// PublishEncoded publishes body, a JSON array of events as POST /v1/events takes them, with one
// call (all or nothing) and returns how many events the node answered. For load tools: encoding
// each event afresh, as PublishBatch does, costs a load tool about half the CPU the node spends
// accepting it, on the machine the node runs on.
func (c *Client) PublishEncoded(ctx context.Context, body []byte) (int, error) {
	b, err := c.do(ctx, http.MethodPost, "/v1/events", body, "Prefer", "return=minimal")
	if err != nil {
		return 0, err
	}
	var resp struct {
		Data []struct{} `json:"data"`
	}
	if err := json.Unmarshal(b, &resp); err != nil {
		return 0, fmt.Errorf("decode POST /v1/events: %w", err)
	}
	return len(resp.Data), nil
}

// GraphQL posts a query and decodes data into out. GraphQL errors become a *StatusError with
// the first error's code.
func (c *Client) GraphQL(ctx context.Context, query string, vars map[string]any, out any) error {
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	if err != nil {
		return err
	}
	b, err := c.do(ctx, http.MethodPost, "/graphql", body)
	if err != nil {
		return err
	}
	var resp struct {
		Data   json.RawMessage `json:"data"`
		Errors []struct {
			Message    string         `json:"message"`
			Extensions map[string]any `json:"extensions"`
		} `json:"errors"`
	}
	if err := json.Unmarshal(b, &resp); err != nil {
		return fmt.Errorf("decode graphql response: %w", err)
	}
	if len(resp.Errors) > 0 {
		code, _ := resp.Errors[0].Extensions["code"].(string)
		return &StatusError{Status: http.StatusOK, Code: code, Body: resp.Errors[0].Message}
	}
	if out != nil {
		if err := json.Unmarshal(resp.Data, out); err != nil {
			return fmt.Errorf("decode graphql data: %w", err)
		}
	}
	return nil
}

// Query selects events for GET /v1/events.
type Query struct {
	ProjectID string
	Type      string    // optional exact type
	Since     time.Time // optional
	Limit     int       // 1..1000; 0 for the server's default (100)
	Cursor    string    // from an earlier Page
}

// Page is one page of GET /v1/events.
type Page struct {
	Events []Event
	Total  int64  // meta.total: all matches of the filters
	Cursor string // meta.cursor: "" on the last page
}

// Events fetches one page.
func (c *Client) Events(ctx context.Context, q Query) (Page, error) {
	v := url.Values{"projectId": {q.ProjectID}}
	if q.Type != "" {
		v.Set("type", q.Type)
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Cursor != "" {
		v.Set("cursor", q.Cursor)
	}
	b, err := c.do(ctx, http.MethodGet, "/v1/events?"+v.Encode(), nil)
	if err != nil {
		return Page{}, err
	}
	var resp struct {
		Data []Event `json:"data"`
		Meta struct {
			Total  int64   `json:"total"`
			Cursor *string `json:"cursor"`
		} `json:"meta"`
	}
	if err := json.Unmarshal(b, &resp); err != nil {
		return Page{}, fmt.Errorf("decode events page: %w", err)
	}
	p := Page{Events: resp.Data, Total: resp.Meta.Total}
	if resp.Meta.Cursor != nil {
		p.Cursor = *resp.Meta.Cursor
	}
	return p, nil
}

// AllEvents follows the cursor from q to the last page and returns every event in the order
// served, with meta.total of the first page and the number of pages. A rate-limited page is
// retried after Retry-After; maxPages bounds the walk.
func (c *Client) AllEvents(ctx context.Context, q Query, maxPages int) (events []Event, total int64, pages int, err error) {
	for pages < maxPages {
		p, err := c.Events(ctx, q)
		if wait, ok := RateLimited(err); ok {
			if !tick.Sleep(ctx, max(wait, 100*time.Millisecond)) {
				return events, total, pages, ctx.Err()
			}
			continue
		}
		if err != nil {
			return events, total, pages, err
		}
		if pages == 0 {
			total = p.Total
		}
		pages++
		events = append(events, p.Events...)
		if p.Cursor == "" {
			return events, total, pages, nil
		}
		q.Cursor = p.Cursor
	}
	return events, total, pages, fmt.Errorf("more than %d pages of events", maxPages)
}

// ProjectID returns the id of the project named name among the projects the key sees.
func (c *Client) ProjectID(ctx context.Context, name string) (string, error) {
	var data struct {
		Organizations []struct {
			Projects []struct{ ID, Name string } `json:"projects"`
		} `json:"organizations"`
	}
	if err := c.GraphQL(ctx, `{ organizations(limit: 100) { projects { id name } } }`, nil, &data); err != nil {
		return "", fmt.Errorf("list projects: %w", err)
	}
	for _, o := range data.Organizations {
		for _, p := range o.Projects {
			if p.Name == name {
				return p.ID, nil
			}
		}
	}
	return "", fmt.Errorf("no project named %q", name)
}

// REST calls method path with in as its JSON body (nil: none) and decodes a 2xx answer into out
// (nil: discarded). Errors are as Publish's.
func (c *Client) REST(ctx context.Context, method, path string, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	b, err := c.do(ctx, method, path, body)
	if err != nil || out == nil {
		return err
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decode %s %s: %w", method, path, err)
	}
	return nil
}

func (c *Client) do(ctx context.Context, method, path string, body []byte, header ...string) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.Key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("read %s %s: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		se := &StatusError{Status: resp.StatusCode, Body: strings.TrimSpace(string(b[:min(len(b), 512)]))}
		var env struct {
			Error struct{ Code string } `json:"error"`
		}
		if json.Unmarshal(b, &env) == nil {
			se.Code = env.Error.Code
		}
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			se.RetryAfter = time.Duration(s) * time.Second
		}
		return nil, se
	}
	return b, nil
}

// Distribution summarizes durations: count, p50, p90, p99 and max, by nearest rank.
type Distribution struct {
	N                  int
	P50, P90, P99, Max time.Duration
}

// Distribute computes the Distribution of ds (which it sorts).
func Distribute(ds []time.Duration) Distribution {
	slices.Sort(ds)
	if len(ds) == 0 {
		return Distribution{}
	}
	return Distribution{N: len(ds), P50: Quantile(ds, 0.50), P90: Quantile(ds, 0.90), P99: Quantile(ds, 0.99), Max: ds[len(ds)-1]}
}

// Quantile is the nearest-rank q-quantile of sorted (the smallest value with at least q of the
// values at or below it).
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	// The epsilon keeps float error (0.99*200 = 198.00000000000003) from moving up a rank.
	rank := int(math.Ceil(float64(len(sorted))*q-1e-9)) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}

func (d Distribution) String() string {
	r := func(x time.Duration) time.Duration { return x.Round(100 * time.Microsecond) }
	return fmt.Sprintf("n=%d p50=%v p90=%v p99=%v max=%v", d.N, r(d.P50), r(d.P90), r(d.P99), r(d.Max))
}
