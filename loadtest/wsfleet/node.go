package wsfleet

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Node is the carehub node under load, reached through its public API only.
type Node struct {
	base string // http://host:port
	hc   *http.Client
}

// NewNode returns a client of the node at base (http://host:port) keeping up to conns
// connections alive.
func NewNode(base string, conns int) *Node {
	return &Node{base: strings.TrimRight(base, "/"), hc: &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns, IdleConnTimeout: time.Minute},
	}}
}

// GQL runs one GraphQL operation with key and decodes data into out; GraphQL errors are
// errors (*GQLError).
func (n *Node) GQL(ctx context.Context, key, query string, vars map[string]any, out any) error {
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
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
	status, err := n.do(ctx, http.MethodPost, "/graphql", key, body, &resp)
	if err != nil {
		return err
	}
	if len(resp.Errors) > 0 {
		return &GQLError{Status: status, Code: fmt.Sprint(resp.Errors[0].Extensions["code"]), Message: resp.Errors[0].Message}
	}
	if status != http.StatusOK {
		return fmt.Errorf("graphql: HTTP %d", status)
	}
	if out != nil {
		return json.Unmarshal(resp.Data, out)
	}
	return nil
}

// GQLError is the first error of a GraphQL answer: its HTTP status, its extensions.code
// (RATE_LIMITED, …) and message.
type GQLError struct {
	Status        int
	Code, Message string
}

func (e *GQLError) Error() string {
	return fmt.Sprintf("graphql: HTTP %d %s: %s", e.Status, e.Code, e.Message)
}

// do sends a request with a JSON body and decodes a JSON answer into out.
func (n *Node) do(ctx context.Context, method, path, key string, body []byte, out any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, method, n.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := n.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: HTTP %d: %.200s", method, path, resp.StatusCode, b)
		}
	}
	return resp.StatusCode, nil
}

// Tenant is the organization of a key and the projects the load uses.
type Tenant struct {
	OrgID    string
	Projects []string
}

// Tenant returns the organization key sees (it must see one) and its projects, only those of
// only when it is not empty.
func (n *Node) Tenant(ctx context.Context, key string, only []string) (Tenant, error) {
	var data struct {
		Organizations []struct {
			ID       string
			Projects []struct{ ID string }
		}
	}
	if err := n.GQL(ctx, key, `{ organizations(limit: 2) { id projects { id } } }`, nil, &data); err != nil {
		return Tenant{}, err
	}
	if len(data.Organizations) != 1 {
		return Tenant{}, fmt.Errorf("the key sees %d organizations; use a key of one organization", len(data.Organizations))
	}
	t := Tenant{OrgID: data.Organizations[0].ID}
	for _, p := range data.Organizations[0].Projects {
		t.Projects = append(t.Projects, p.ID)
	}
	if len(only) > 0 {
		for _, id := range only {
			found := false
			for _, p := range t.Projects {
				found = found || p == id
			}
			if !found {
				return Tenant{}, fmt.Errorf("project %s is not one of the organization's", id)
			}
		}
		t.Projects = only
	}
	if len(t.Projects) == 0 {
		return Tenant{}, fmt.Errorf("organization %s has no projects", t.OrgID)
	}
	return t, nil
}

// CreatedKey is a key a run made, to revoke at its end.
type CreatedKey struct {
	ID     string `json:"id"`
	Secret string `json:"key"`
}

// CreateKey makes a test-mode key of the admin key's organization (POST /v1/api-keys). Test mode
// keeps the HIPAA audit log, which records every call of a live key, out of the measurement.
func (n *Node) CreateKey(ctx context.Context, admin, name string, scopes []string) (CreatedKey, error) {
	body, _ := json.Marshal(map[string]any{"name": name, "mode": "test", "scopes": scopes})
	var k CreatedKey
	status, err := n.do(ctx, http.MethodPost, "/v1/api-keys", admin, body, &k)
	if err != nil {
		return k, err
	}
	if status != http.StatusCreated || k.Secret == "" {
		return k, fmt.Errorf("POST /v1/api-keys: HTTP %d (the -key needs admin:org)", status)
	}
	return k, nil
}

// RevokeKey revokes the key id with admin (POST /v1/api-keys/{id}/revoke).
func (n *Node) RevokeKey(ctx context.Context, admin, id string) error {
	status, err := n.do(ctx, http.MethodPost, "/v1/api-keys/"+id+"/revoke", admin, nil, nil)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("revoke %s: HTTP %d", id, status)
	}
	return err
}

// Metrics reads the named metrics from metricsURL (a Prometheus text page): the sum of each
// metric's samples.
func (n *Node) Metrics(ctx context.Context, metricsURL string, names ...string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := n.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: HTTP %d", metricsURL, resp.StatusCode)
	}
	want := map[string]bool{}
	for _, name := range names {
		want[name] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(series, "{")
		if !want[name] {
			continue
		}
		f, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err == nil {
			out[name] += f
		}
	}
	return out, sc.Err()
}

// Loopback checks that every address (URL or host:port) is a loopback one: the load stays on
// this machine. kind names the flag in the error.
func Loopback(kind string, addrs ...string) error {
	for _, a := range addrs {
		host := a
		if u, err := url.Parse(a); err == nil && u.Host != "" {
			host = u.Host
		}
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		ip := net.ParseIP(host)
		if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return fmt.Errorf("%s %q is not a loopback address: the load tools only load this machine", kind, a)
		}
	}
	return nil
}
