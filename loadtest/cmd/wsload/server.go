package main

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

// node is the carehub node under load, reached through its public API only.
type node struct {
	base string // http://host:port
	hc   *http.Client
}

func newNode(base string, conns int) *node {
	return &node{base: strings.TrimRight(base, "/"), hc: &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns, IdleConnTimeout: time.Minute},
	}}
}

// gql runs one GraphQL operation and decodes data into out; GraphQL errors are errors.
func (n *node) gql(ctx context.Context, key, query string, vars map[string]any, out any) error {
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
		return &gqlError{status: status, code: fmt.Sprint(resp.Errors[0].Extensions["code"]), msg: resp.Errors[0].Message}
	}
	if status != http.StatusOK {
		return fmt.Errorf("graphql: HTTP %d", status)
	}
	if out != nil {
		return json.Unmarshal(resp.Data, out)
	}
	return nil
}

type gqlError struct {
	status    int
	code, msg string
}

func (e *gqlError) Error() string {
	return fmt.Sprintf("graphql: HTTP %d %s: %s", e.status, e.code, e.msg)
}

// do sends a request with a JSON body and decodes a JSON answer into out.
func (n *node) do(ctx context.Context, method, path, key string, body []byte, out any) (int, error) {
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

// tenant is the organization of the key and the projects the load uses.
type tenant struct {
	orgID    string
	projects []string
}

func (n *node) tenant(ctx context.Context, key string, only []string) (tenant, error) {
	var data struct {
		Organizations []struct {
			ID       string
			Projects []struct{ ID string }
		}
	}
	if err := n.gql(ctx, key, `{ organizations(limit: 2) { id projects { id } } }`, nil, &data); err != nil {
		return tenant{}, err
	}
	if len(data.Organizations) != 1 {
		return tenant{}, fmt.Errorf("the key sees %d organizations; use a key of one organization", len(data.Organizations))
	}
	t := tenant{orgID: data.Organizations[0].ID}
	for _, p := range data.Organizations[0].Projects {
		t.projects = append(t.projects, p.ID)
	}
	if len(only) > 0 {
		for _, id := range only {
			found := false
			for _, p := range t.projects {
				found = found || p == id
			}
			if !found {
				return tenant{}, fmt.Errorf("project %s is not one of the organization's", id)
			}
		}
		t.projects = only
	}
	if len(t.projects) == 0 {
		return tenant{}, fmt.Errorf("organization %s has no projects", t.orgID)
	}
	return t, nil
}

// createdKey is a key this run made, revoked at the end.
type createdKey struct {
	ID     string `json:"id"`
	Secret string `json:"key"`
}

// createKey makes a test-mode key of the admin key's organization (POST /v1/api-keys). Test mode
// keeps the HIPAA audit log, which records every call of a live key, out of the measurement.
func (n *node) createKey(ctx context.Context, admin, name string, scopes []string) (createdKey, error) {
	body, _ := json.Marshal(map[string]any{"name": name, "mode": "test", "scopes": scopes})
	var k createdKey
	status, err := n.do(ctx, http.MethodPost, "/v1/api-keys", admin, body, &k)
	if err != nil {
		return k, err
	}
	if status != http.StatusCreated || k.Secret == "" {
		return k, fmt.Errorf("POST /v1/api-keys: HTTP %d (the -key needs admin:org)", status)
	}
	return k, nil
}

func (n *node) revokeKey(ctx context.Context, admin, id string) error {
	status, err := n.do(ctx, http.MethodPost, "/v1/api-keys/"+id+"/revoke", admin, nil, nil)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("revoke %s: HTTP %d", id, status)
	}
	return err
}

// metrics reads the named metrics from metricsURL (a Prometheus text page): the sum of each
// metric's samples.
func (n *node) metrics(ctx context.Context, metricsURL string, names ...string) (map[string]float64, error) {
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

// loopback checks that every address is a loopback one: the load stays on this machine.
func loopback(kind string, addrs ...string) error {
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
			return fmt.Errorf("%s %q is not a loopback address: wsload only loads this machine", kind, a)
		}
	}
	return nil
}
