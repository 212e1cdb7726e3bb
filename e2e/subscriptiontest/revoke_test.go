package subscriptiontest

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	"carehub/api/ws/wstest"
	"carehub/cmd/carehub/node"
	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// recheckOften re-checks socket credentials every 50 ms, so that a test waits for the key cache
// (5 s, on a node that did not make the change) rather than for the re-check.
func recheckOften(c *node.Config) { c.SocketRecheck = 50 * time.Millisecond }

// createdKey is an API key made through POST /v1/api-keys.
type createdKey struct {
	ID     string `json:"id"`
	Secret string `json:"key"`
}

// createKey makes a live key of admin's organization with scopes, through the REST API.
func (n *testNode) createKey(t testing.TB, admin string, scopes ...string) createdKey {
	t.Helper()
	r := n.Do(http.MethodPost, "/v1/api-keys", admin, map[string]any{"name": "socket test", "mode": access.Live, "scopes": append([]string{}, scopes...)})
	if r.Status != http.StatusCreated {
		t.Fatalf("POST /v1/api-keys: %d %s", r.Status, r.Body)
	}
	var k createdKey
	r.JSON(t, &k)
	return k
}

// exchange buys a JWT for key through POST /v1/auth/token.
func (n *testNode) exchange(t testing.TB, key string, scopes ...string) string {
	t.Helper()
	r := n.Do(http.MethodPost, "/v1/auth/token", key, map[string]any{"scope": append([]string{}, scopes...)})
	if r.Status != http.StatusOK {
		t.Fatalf("POST /v1/auth/token: %d %s", r.Status, r.Body)
	}
	var tok struct {
		AccessToken string `json:"access_token"`
	}
	r.JSON(t, &tok)
	return tok.AccessToken
}

// post sends a REST call that must answer want.
func (n *testNode) post(t testing.TB, path, key string, want int) {
	t.Helper()
	if r := n.Do(http.MethodPost, path, key, nil); r.Status != want {
		t.Fatalf("POST %s: %d %s, want %d", path, r.Status, r.Body, want)
	}
}

// closedWith waits (with a deadline, not a sleep) for the socket to end and checks that the
// server closed it with code.
func closedWith(t testing.TB, c *wstest.Client, code websocket.StatusCode, within time.Duration, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	err := c.Wait(ctx)
	if ctx.Err() != nil {
		t.Fatalf("%s: the socket is still open after %v", what, within)
	}
	if got := websocket.CloseStatus(err); got != code {
		t.Fatalf("%s: socket ended with %v (close code %d), want close %d", what, err, got, code)
	}
}

// TestWithdrawnCredentialClosesSocket: a socket lives only as long as its credential. An open
// eventStream delivers; its key is revoked through REST; REST answers 401 and the socket is
// closed with 4403 in both protocols. The same holds for a JWT whose parent key is revoked, a
// key rotated past its 24 h grace, and a key that loses the scope a subscription needs.
func TestWithdrawnCredentialClosesSocket(t *testing.T) {
	n := startNode(t, recheckOften)
	admin := n.DemoKey()
	project := n.projectID(t, admin, demo.DemoOrgSlug, demo.SepsisProjectName)
	agentID := n.agentID(t, admin, project, demo.Ward7AgentName)
	n.ready(t, admin, project)
	events := map[string]any{"projectId": project}

	for _, p := range protocols {
		t.Run(p.name+"/key revoked", func(t *testing.T) {
			k := n.createKey(t, admin)
			c := n.dial(t, p, k.Secret)
			arrivals := watch(subscribe(t, c, "events", eventStreamQuery, events), "eventStream")
			n.waitSubscribers(t, 1)
			// It delivers: the close below is the revocation's doing, not a dead socket's.
			pub := n.mustPublish(t, admin, project, "lab.result_ready", map[string]any{"test": t.Name()})
			if a := nextOf(t, arrivals, "lab.result_ready", 10*time.Second, "before the revocation"); a.ev.ID != pub.ID {
				t.Fatalf("received %s, want %s", a.obj, pub.ID)
			}

			n.post(t, "/v1/api-keys/"+k.ID+"/revoke", admin, http.StatusOK)
			if r := n.Do(http.MethodGet, "/v1/organizations", k.Secret, nil); r.Status != http.StatusUnauthorized {
				t.Fatalf("REST with the revoked key: %d %s, want 401", r.Status, r.Body)
			}
			closedWith(t, c, 4403, 15*time.Second, "revoked key")
			n.waitSubscribers(t, 0)
		})

		t.Run(p.name+"/parent key of a JWT revoked", func(t *testing.T) {
			k := n.createKey(t, admin)
			c := n.dial(t, p, n.exchange(t, k.Secret))
			subscribe(t, c, "events", eventStreamQuery, events)
			n.waitSubscribers(t, 1)
			n.post(t, "/v1/api-keys/"+k.ID+"/revoke", admin, http.StatusOK)
			closedWith(t, c, 4403, 15*time.Second, "JWT of a revoked key")
			n.waitSubscribers(t, 0)
		})

		t.Run(p.name+"/key rotated past its grace", func(t *testing.T) {
			k := n.createKey(t, admin)
			c := n.dial(t, p, k.Secret)
			arrivals := watch(subscribe(t, c, "events", eventStreamQuery, events), "eventStream")
			n.waitSubscribers(t, 1)
			n.post(t, "/v1/api-keys/"+k.ID+"/rotate", admin, http.StatusCreated)
			// Within the grace the socket stays and delivers.
			pub := n.mustPublish(t, admin, project, "lab.result_ready", map[string]any{"test": t.Name()})
			if a := nextOf(t, arrivals, "lab.result_ready", 10*time.Second, "within the grace"); a.ev.ID != pub.ID {
				t.Fatalf("received %s, want %s", a.obj, pub.ID)
			}
			// 24 hours pass (no test waits a day: the grace ends in the key store).
			if _, err := n.Pool().Exec(context.Background(), `update api_keys set expires_at = now() - interval '1 second' where id = $1`, k.ID); err != nil {
				t.Fatal(err)
			}
			closedWith(t, c, 4403, 15*time.Second, "rotated key past its grace")
			n.waitSubscribers(t, 0)
		})

		t.Run(p.name+"/scope removed", func(t *testing.T) {
			k := n.createKey(t, admin, access.ExecAgents)
			c := n.dial(t, p, k.Secret)
			subscribe(t, c, "sessions", agentSessionQuery, map[string]any{"id": agentID})
			n.waitSubscribers(t, 1)
			// No API narrows a key; an operator does it in the key store.
			if _, err := n.Pool().Exec(context.Background(), `update api_keys set scopes = '{}' where id = $1`, k.ID); err != nil {
				t.Fatal(err)
			}
			closedWith(t, c, 4403, 15*time.Second, "key without exec:agents")
			n.waitSubscribers(t, 0)
		})
	}
}

// TestRevocationReachesEveryNode: two nodes share Postgres; a key revoked through node 1 closes
// the sockets it holds open on node 2 (api only), within node 2's key cache interval.
func TestRevocationReachesEveryNode(t *testing.T) {
	n1 := startNode(t)
	cfg := n1.Cfg()
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.Roles = []string{node.RoleAPI}
	recheckOften(&cfg)
	n2 := wrap(servertest.StartConfig(t, cfg))

	admin := n1.DemoKey()
	project := n2.projectID(t, admin, demo.DemoOrgSlug, demo.SepsisProjectName)
	k := n1.createKey(t, admin)
	sockets := map[string]*wstest.Client{}
	for _, p := range protocols {
		c := n2.dial(t, p, k.Secret)
		subscribe(t, c, "events", eventStreamQuery, map[string]any{"projectId": project})
		sockets[p.name] = c
	}
	n2.waitSubscribers(t, len(protocols))

	n1.post(t, "/v1/api-keys/"+k.ID+"/revoke", admin, http.StatusOK)
	for name, c := range sockets {
		closedWith(t, c, 4403, 30*time.Second, fmt.Sprintf("%s socket on node 2", name))
	}
	n2.waitSubscribers(t, 0)
}
