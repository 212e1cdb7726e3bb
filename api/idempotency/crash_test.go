package idempotency_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/e2e/servertest"
	"carehub/internal/testenv"
	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/storage/demo"
	core "carehub/storage/idempotency"
	"carehub/storage/postgres"
)

// TestRetryAfterCrash is the crash acceptance of Idempotency-Key, on the real binary: a node
// built with -tags carehub_crashtest and run with CAREHUB_CRASH_AFTER_STEP set kills itself
// with SIGKILL right after a request's effect has committed, before its answer is recorded or
// sent. The client's retry with the same key, on the restarted node, must get the answer of
// that effect, and the effect must exist once: one webhook for POST /v1/webhooks, one event for
// publishEvent.
func TestRetryAfterCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs the carehub binary")
	}
	bin := filepath.Join(t.TempDir(), "carehub")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-tags", "carehub_crashtest", "-o", bin, "carehub/cmd/carehub").CombinedOutput(); err != nil {
		t.Fatalf("build carehub: %v\n%s", err, out)
	}
	cfg := servertest.Config(t) // a fresh database and a broker of this test
	pool, err := postgres.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := &crashNode{t: t, bin: bin, addr: testenv.FreeAddr(t), args: []string{"serve", "--database-url", cfg.DatabaseURL,
		"--kafka-brokers", strings.Join(cfg.KafkaBrokers, ","), "--kafka-namespace=" + cfg.KafkaNamespace, "--data-dir", cfg.DataDir, "--partitions", "3",
		"--webhooks-allow-private", "--log-level", "warn"}}

	c.start(false) // seeds the demo tenant
	key := newKey(t, pool)
	var project string
	if err := pool.QueryRow(ctx, `select id from projects where org_id = $1 and name = $2`, demo.DemoOrgID, demo.SepsisProjectName).Scan(&project); err != nil {
		t.Fatal(err)
	}
	c.stop()
	typ := fmt.Sprintf("idem.crash_%d", time.Now().UnixNano())
	hook := "https://crash.example/" + typ
	webhook := map[string]any{"projectId": project, "url": hook, "events": []string{"*"}}
	event := map[string]any{"query": publish, "variables": map[string]any{"p": project, "t": typ}}
	count := func(query string, arg string) int {
		var n int
		if err := pool.QueryRow(ctx, query, arg).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	webhooks := func() int { return count(`select count(*) from webhooks where url = $1`, hook) }
	events := func() int { return count(`select count(*) from outbox where value->>'type' = $1`, typ) }

	for _, call := range []struct {
		path string
		body any
	}{{"/v1/webhooks", webhook}, {"/graphql", event}} {
		c.start(true)
		if r, err := send(c.url(), "POST", call.path, key, []string{"crash" + call.path}, call.body); err == nil {
			t.Fatalf("POST %s answered %d %s: the node was to die before answering", call.path, r.Status, r.Body)
		}
		c.wait()
	}
	if webhooks() != 1 || events() != 1 {
		t.Fatalf("after the crashes: %d webhooks, %d events; the effects were to commit before the kill", webhooks(), events())
	}

	c.start(false)
	defer c.stop()
	// The dead requests' leases run out first: until then their keys are in progress (409). A
	// client retrying that often may be rate limited (429) meanwhile: it waits as for a 409.
	retry := func(path string, body any) *servertest.Response {
		var r *servertest.Response
		servertest.Eventually(t, 2*core.DefaultLease, "the dead request's lease to run out", func() bool {
			var err error
			if r, err = send(c.url(), "POST", path, key, []string{"crash" + path}, body); err != nil {
				t.Fatal(err)
			}
			return r.Status != http.StatusConflict && r.Status != http.StatusTooManyRequests
		})
		if r.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry of POST %s: not marked replayed: %d %s", path, r.Status, r.Body)
		}
		return r
	}
	r := retry("/v1/webhooks", webhook)
	var wh struct{ ID, URL string }
	r.JSON(t, &wh)
	var stored string
	if err := pool.QueryRow(ctx, `select id from webhooks where url = $1`, hook).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusCreated || wh.ID != stored {
		t.Errorf("retry of POST /v1/webhooks: %d %s, want 201 with the webhook %s that committed", r.Status, r.Body, stored)
	}

	r = retry("/graphql", event)
	var g gqlResponse
	r.JSON(t, &g)
	var published string
	if err := pool.QueryRow(ctx, `select event_id from outbox where value->>'type' = $1`, typ).Scan(&published); err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusOK || len(g.Errors) > 0 || g.Data.PublishEvent.ID != published {
		t.Errorf("retry of publishEvent: %d %s, want the event %s that committed", r.Status, r.Body, published)
	}
	// And again: now the recorded answer.
	if again, err := send(c.url(), "POST", "/graphql", key, []string{"crash/graphql"}, event); err != nil || !bytes.Equal(again.Body, r.Body) {
		t.Errorf("third call: %v %s, want %s", err, again.Body, r.Body)
	}
	if webhooks() != 1 || events() != 1 {
		t.Errorf("after the retries: %d webhooks, %d events; want 1 of each", webhooks(), events())
	}
	// The event log, as clients read it, has the event once.
	servertest.Eventually(t, time.Minute, "the event in GET /v1/events", func() bool {
		r, err := send(c.url(), "GET", "/v1/events?projectId="+project+"&type="+typ, key, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		var page struct {
			Data []struct{ ID string }
		}
		r.JSON(t, &page)
		if len(page.Data) > 1 {
			t.Fatalf("GET /v1/events: %s, want one event", r.Body)
		}
		return len(page.Data) == 1 && page.Data[0].ID == published
	})
}

func newKey(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	k, err := postgres.NewAPIKeys(pool).Create(context.Background(), apikeys.NewKey{OrgID: demo.DemoOrgID, Mode: access.Live,
		Scopes: []string{access.AdminOrg, access.ExecWorkflows}})
	if err != nil {
		t.Fatal(err)
	}
	return k.Secret
}

// crashNode is `carehub serve` as a subprocess on the test's database and broker.
type crashNode struct {
	t      *testing.T
	bin    string
	addr   string
	args   []string
	cmd    *exec.Cmd
	stderr bytes.Buffer
	done   chan struct{}
}

func (c *crashNode) url() string { return "http://" + c.addr }

// start runs the node, armed to die after its next committed step or not, and waits until it
// is ready. An armed node runs only the api role: it joins no consumer group, so the restarted
// node's consumers need not wait for the killed members' sessions to time out.
func (c *crashNode) start(armed bool) {
	c.t.Helper()
	c.cmd = exec.Command(c.bin, slices.Concat(c.args, []string{"--http-addr", c.addr})...)
	c.cmd.Env = os.Environ()
	if armed {
		c.cmd.Args = append(c.cmd.Args, "--roles", "api")
		c.cmd.Env = append(c.cmd.Env, "CAREHUB_CRASH_AFTER_STEP=1")
	}
	c.stderr.Reset()
	c.cmd.Stderr = &c.stderr
	if err := c.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(c.cmd, c.done)
	c.t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	})
	servertest.Eventually(c.t, 2*time.Minute, "carehub serve to be ready", func() bool {
		select {
		case <-c.done:
			c.t.Fatalf("carehub serve exited before it was ready:\n%s", c.stderr.String())
		default:
		}
		resp, err := http.Get(c.url() + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// wait waits for an armed node to have killed itself.
func (c *crashNode) wait() {
	c.t.Helper()
	select {
	case <-c.done:
	case <-time.After(time.Minute):
		c.t.Fatal("the armed node did not die")
	}
	if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		c.t.Fatalf("the node ended with %v, want SIGKILL:\n%s", c.cmd.ProcessState, c.stderr.String())
	}
}

// stop ends the node with SIGTERM.
func (c *crashNode) stop() {
	c.t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(time.Minute):
		c.t.Fatal("carehub did not stop within a minute of SIGTERM")
	}
}
