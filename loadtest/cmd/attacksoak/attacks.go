package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/api/ws/wstest"
	"carehub/kernel/access"
)

// attackerOrg is the third tenant, whose ordinary keys attack.
const attackerOrg = "lakeside-clinic"

// attackerKeys are the keys one tenant's staff could be given, and what they know.
type attackerKeys struct {
	live, test, writer string   // every scope (live, test); write:patients alone
	billing            []string // admin:billing alone
	orgID, project     string
	realPatient        string // a real patient of the attacker's own organization
	mrn                string // an identifier of it, system|value
	idemKey, jwt       string // a POST /v1/webhooks made with live, and a JWT of live narrowed to exec:workflows
}

func attackerSetUp(ctx context.Context, w *world) (*attackerKeys, error) {
	a := &attackerKeys{idemKey: fmt.Sprintf("soak-%d", time.Now().UnixNano())}
	var err error
	if a.live, err = w.n.key(ctx, attackerOrg, access.Live, allScopes...); err != nil {
		return nil, err
	}
	if a.test, err = w.n.key(ctx, attackerOrg, access.Test, allScopes...); err != nil {
		return nil, err
	}
	if a.writer, err = w.n.key(ctx, attackerOrg, access.Live, access.WritePatients); err != nil {
		return nil, err
	}
	for range 20 {
		k, err := w.n.key(ctx, attackerOrg, access.Live, access.AdminBilling)
		if err != nil {
			return nil, err
		}
		a.billing = append(a.billing, k)
	}
	if a.project, a.realPatient, err = w.firstIDs(ctx, a.live); err != nil {
		return nil, err
	}
	var orgs struct{ Data []struct{ ID string } }
	if err := w.getJSON(ctx, a.live, "/v1/organizations", &orgs); err != nil || len(orgs.Data) == 0 {
		return nil, fmt.Errorf("attacker's organization: %v", err)
	}
	a.orgID = orgs.Data[0].ID
	var pat struct {
		ID         string `json:"id"`
		Identifier []struct{ System, Value string }
	}
	if err := w.getJSON(ctx, a.live, "/v1/patients/"+a.realPatient, &pat); err == nil && len(pat.Identifier) > 0 {
		a.mrn = pat.Identifier[0].System + "|" + pat.Identifier[0].Value
	}
	// Large payloads for the scalar-size attack: 40 events of 200 KiB.
	pad := strings.Repeat("x", 200<<10)
	for i := range 40 {
		body := fmt.Appendf(nil, `{"projectId":%q,"type":"soak.big","payload":{"i":%d,"pad":%q}}`, a.project, i, pad)
		if status, b, err := w.do(ctx, "POST", "/v1/events", a.live, "application/json", body); err != nil || status/100 != 2 {
			return nil, fmt.Errorf("publish a large event: %d %s %v", status, b, err)
		}
	}
	// An answer worth replaying: a webhook, with its secret.
	hook := fmt.Appendf(nil, `{"projectId":%q,"url":"http://127.0.0.1:9/hook","events":["soak.big"]}`, a.project)
	req, _ := httpRequest(ctx, "POST", w.n.url+"/v1/webhooks", a.live, hook)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", a.idemKey)
	if resp, err := w.http.Do(req); err == nil {
		resp.Body.Close()
	}
	status, b, err := w.do(ctx, "POST", "/v1/auth/token", a.live, "application/json", []byte(`{"scope":["exec:workflows"]}`))
	if err == nil && status == 200 {
		var tok struct {
			AccessToken string `json:"access_token"`
		}
		_ = json.Unmarshal(b, &tok)
		a.jwt = tok.AccessToken
	}
	return a, nil
}

// attacker runs every attack in a loop, each in goroutines of its own, and counts the answers.
type attacker struct {
	w    *world
	c    config
	k    *attackerKeys
	mu   sync.Mutex
	seen map[string]map[string]int // attack → answer (status or "err") → count
}

func newAttacker(w *world, c config) *attacker {
	return &attacker{w: w, c: c, k: w.attacker, seen: map[string]map[string]int{}}
}

func (a *attacker) count(attack, answer string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.seen[attack] == nil {
		a.seen[attack] = map[string]int{}
	}
	a.seen[attack][answer]++
}

// counts returns "attack: answer×n, …" lines, sorted.
func (a *attacker) counts() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for attack, answers := range a.seen {
		var parts []string
		for ans, n := range answers {
			parts = append(parts, fmt.Sprintf("%s×%d", ans, n))
		}
		sort.Strings(parts)
		out = append(out, attack+": "+strings.Join(parts, " "))
	}
	sort.Strings(out)
	return out
}

// start runs the attacks until ctx ends; the returned function waits for them.
func (a *attacker) start(ctx context.Context) func() {
	var wg sync.WaitGroup
	picked := func(name string) bool {
		if a.c.only == "" {
			return true
		}
		num, _, _ := strings.Cut(name, " ")
		return slices.Contains(strings.Split(a.c.only, ","), num)
	}
	run := func(name string, fn func(ctx context.Context)) {
		if picked(name) {
			wg.Go(func() { fn(ctx) })
		}
	}
	loop := func(name string, fn func(ctx context.Context) string) {
		if !picked(name) {
			return
		}
		wg.Go(func() {
			for ctx.Err() == nil {
				a.count(name, fn(ctx))
			}
		})
	}
	k := a.k
	loop("1 poison event", func(ctx context.Context) string {
		bodies := []string{`{"n":1e999999}`, `{"s":"\ud800"}`, `{"n":` + strings.Repeat("9", 5000) + `}`, `{"\udfff":1}`}
		body := fmt.Sprintf(`{"projectId":%q,"type":"soak.poison","payload":%s}`, k.project, bodies[time.Now().Nanosecond()%len(bodies)])
		return a.call(ctx, "POST", "/v1/events", k.live, "application/json", body, nil)
	})
	run("2 slow body", a.slowBodies)
	loop("3 test key names a real patient", func(ctx context.Context) string {
		body := fmt.Sprintf(`{"projectId":%q,"type":"vitals.deteriorating","payload":{"patientId":%q,"news2":9}}`, k.project, k.realPatient)
		return a.call(ctx, "POST", "/v1/events", k.test, "application/json", body, nil)
	})
	loop("4 large scalars", func(ctx context.Context) string {
		var q strings.Builder
		q.WriteString("{")
		for i := range 16 {
			fmt.Fprintf(&q, " a%d: events(limit: 100) { payload }", i)
		}
		q.WriteString(" }")
		body, _ := json.Marshal(map[string]string{"query": q.String()})
		return a.call(ctx, "POST", "/graphql", k.live, "application/json", string(body), nil)
	})
	run("5 anonymous broker client", a.broker)
	loop("6 conditional create", func(ctx context.Context) string {
		body := `{"resourceType":"Patient","name":[{"family":"Probe"}],"identifier":[{"system":"` +
			strings.Split(k.mrn, "|")[0] + `","value":"` + strings.TrimPrefix(k.mrn, strings.Split(k.mrn, "|")[0]+"|") + `"}]}`
		return a.call(ctx, "POST", "/fhir/R4/Patient", k.writer, "application/fhir+json", body,
			map[string]string{"If-None-Exist": "identifier=" + url.QueryEscape(k.mrn)})
	})
	loop("7 replay with a narrowed JWT", func(ctx context.Context) string {
		body := fmt.Sprintf(`{"projectId":%q,"url":"http://127.0.0.1:9/hook","events":["soak.big"]}`, k.project)
		return a.call(ctx, "POST", "/v1/webhooks", k.jwt, "application/json", body, map[string]string{"Idempotency-Key": k.idemKey})
	})
	loop("8 statistics and filters", func(ctx context.Context) string {
		from := url.QueryEscape(time.Now().Add(-time.Hour).UTC().Format(time.RFC3339))
		if time.Now().Nanosecond()%2 == 0 {
			return a.call(ctx, "GET", "/v1/events?patientId="+k.realPatient, k.test, "", "", nil)
		}
		return a.call(ctx, "GET", "/v1/events/stats?groupBy=status&from="+from, k.billing[0], "", "", nil)
	})
	loop("9 retention overflow", func(ctx context.Context) string {
		days := []string{"107000003", "2147483648", "9223372036854775807"}[time.Now().Nanosecond()%3]
		return a.call(ctx, "PUT", "/v1/organizations/"+k.orgID+"/retention", k.live, "application/json",
			`{"auditRetentionDays":`+days+`}`, nil)
	})
	run("10 sockets", a.sockets)
	loop("12 surrogate in a Patient", func(ctx context.Context) string {
		return a.call(ctx, "POST", "/fhir/R4/Patient", k.writer, "application/fhir+json",
			`{"resourceType":"Patient","name":[{"family":"\ud800"}]}`, nil)
	})
	return wg.Wait
}

// call sends one attack request and returns its status, or "err".
func (a *attacker) call(ctx context.Context, method, path, key, ctype, body string, headers map[string]string) string {
	var b []byte
	if body != "" {
		b = []byte(body)
	}
	req, err := httpRequest(ctx, method, a.w.n.url+path, key, b)
	if err != nil {
		return "err"
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for h, v := range headers {
		req.Header.Set(h, v)
	}
	resp, err := a.w.http.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
		}
		return "err"
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode == 429 { // honour the limiter, as a patient attacker would
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Sprint(resp.StatusCode)
}

// slowBodies holds c.slow connections that promise a body of 1,000,000 bytes and send one,
// spread over the billing keys, opening a new one whenever the node closes one (finding 2). A
// connection answered at once (429 past a key's requests in progress, 503 past the node's
// connections) is opened again after a second, as its Retry-After says: the attack is holding
// connections, not a flood of new ones, which no node shares two cores with and survives.
func (a *attacker) slowBodies(ctx context.Context) {
	host := strings.TrimPrefix(a.w.n.url, "http://")
	sem := make(chan struct{}, a.c.slow)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 0; ctx.Err() == nil; i++ {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		key := a.k.billing[i%len(a.k.billing)]
		wg.Go(func() {
			defer func() { <-sem }()
			conn, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", host)
			if err != nil {
				a.count("2 slow body", "dial refused")
				time.Sleep(100 * time.Millisecond)
				return
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST /v1/events HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{", host, key)
			stop := context.AfterFunc(ctx, func() { conn.Close() })
			defer stop()
			start := time.Now()
			buf := make([]byte, 512)
			n, _ := conn.Read(buf) // until the node answers or closes
			if ctx.Err() != nil {
				return
			}
			held := time.Since(start)
			answer := "closed by the node"
			if n > 0 {
				answer = "answered " + statusOf(buf[:n])
			}
			a.count("2 slow body", fmt.Sprintf("%s after %s", answer, holdBucket(held)))
			if held < time.Second {
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		})
	}
}

// broker tries the embedded broker without credentials (finding 5).
func (a *attacker) broker(ctx context.Context) {
	for ctx.Err() == nil {
		cl, err := kgo.NewClient(kgo.SeedBrokers(a.w.n.brokers...), kgo.RequestRetries(0), kgo.DialTimeout(2*time.Second))
		if err != nil {
			a.count("5 anonymous broker client", "err")
			return
		}
		lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		topics, err := kadm.NewClient(cl).ListTopics(lctx)
		cancel()
		cl.Close()
		switch {
		case err != nil:
			a.count("5 anonymous broker client", "refused")
		case len(topics) > 0:
			a.count("5 anonymous broker client", "LISTED TOPICS")
		default:
			a.count("5 anonymous broker client", "saw nothing")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sockets holds up to c.sockets WebSocket connections on the billing keys, each subscribing as
// often as the node lets it, while a 100 KB event is published to the project every second
// (finding 10).
func (a *attacker) sockets(ctx context.Context) {
	wsURL := "ws" + strings.TrimPrefix(a.w.n.url, "http") + "/graphql"
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range a.c.sockets {
		if ctx.Err() != nil {
			return
		}
		cl, err := wstest.Dial(ctx, wsURL, a.k.billing[i%len(a.k.billing)])
		if err != nil {
			a.count("10 sockets", "dial refused")
			continue
		}
		a.count("10 sockets", "open")
		wg.Go(func() {
			defer cl.Close()
			for j := range 200 {
				_, err := cl.Subscribe(ctx, fmt.Sprint(j), `subscription($p: ID!) { eventStream(projectId: $p) { id payload } }`,
					map[string]any{"p": a.k.project})
				if err != nil {
					a.count("10 subscriptions", "refused")
					break
				}
				a.count("10 subscriptions", "sent")
			}
			select {
			case <-ctx.Done():
			case <-cl.Done():
				a.count("10 sockets", "closed by the node")
			}
		})
	}
	pad := strings.Repeat("y", 100<<10)
	for ctx.Err() == nil {
		body := fmt.Sprintf(`{"projectId":%q,"type":"soak.fanout","payload":{"pad":%q}}`, a.k.project, pad)
		a.count("10 100 KB events to the subscribers", a.call(ctx, "POST", "/v1/events", a.k.live, "application/json", body, nil))
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// statusOf is the status code of an HTTP answer's first line, or "?".
func statusOf(b []byte) string {
	if f := strings.Fields(string(b)); len(f) > 1 && strings.HasPrefix(f[0], "HTTP/") {
		return f[1]
	}
	return "?"
}

// holdBucket words how long a connection was held, coarsely enough to count.
func holdBucket(d time.Duration) string {
	switch {
	case d < time.Second:
		return "<1s"
	case d < 10*time.Second:
		return "1-10s"
	case d < 25*time.Second:
		return "10-25s"
	default:
		return ">=25s"
	}
}
