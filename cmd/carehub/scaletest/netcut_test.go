package scaletest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/e2e/servertest"
	"carehub/internal/testenv"
)

// cutFor is how long the node is cut off from the brokers: longer than the intake's request
// timeout (30 s) and the abort after it, so a call made as the link drops is answered while the
// link is still down.
const cutFor = 45 * time.Second

// cutAnswerBound is how long a call to the cut-off node may take: the intake's 30 s request
// timeout, the 5 s its transaction's abort may take, and some slack.
const cutAnswerBound = 40 * time.Second

// cutRecoverBound is how soon after the restore observations and arrays of events must be
// acknowledged again: the bound for a broker kill.
const cutRecoverBound = 30 * time.Second

// TestFaultNetworkCut runs an api and ingest node in a network namespace of its own, whose only
// way to the three brokers is one veth pair, and a processors node outside, under the load of
// TestFaults. It takes the brokers' end of that pair down for cutFor (the node's packets to the
// brokers are then dropped, as in a real partition: no tc netem here, and a link that is down
// leaves existing connections to time out, where a route deleted would refuse at once), then
// brings it up, and checks: during the cut every call answers within cutAnswerBound, with a 503
// where it needs the brokers and never a 500, and /readyz says kafka is down; after it,
// acknowledged observations and arrays resume, and everything acknowledged is stored once,
// delivered to the webhook and pushed to the subscriber.
func TestFaultNetworkCut(t *testing.T) {
	if !faultsOn() {
		t.Skip("the fault suite kills engines: make test-faults (" + EnvFaults + "=1)")
	}
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root to make a network namespace and veth pairs (CI runs as root)")
	}
	root := checkoutRoot(t)
	ns := newNetns(t)

	kc := startCluster(t, root, "KAFKA_CLUSTER_HOST="+ns.brokers)
	pg := startPostgres(t)
	dsn := pg.dsn(t) // a unix socket: reachable from inside the namespace
	common := clusterFlags(t, dsn, kc.brokers)
	cut := ns.start(t, "node", append(slices.Clone(common), "--roles", "api,ingest", "--ingest-transactional-id", "netcut-node",
		"--allow-insecure-http", "--demo-key")...)
	start(t, "processors", append(slices.Clone(common), "--roles", "processors", "--seed", "none")...)
	db, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(context.Background()) })
	l, v := loadOn(t, cut, cut.addr, db)

	began := time.Now()
	ns.cut(t)
	restoreAt := began.Add(cutFor)

	// A call of each kind made as the link drops, when the node does not know yet.
	answers := make([]cutAnswer, 3)
	var wg sync.WaitGroup
	for i, call := range []func() cutAnswer{l.cutObserve, l.cutArray, l.cutPublish} {
		wg.Go(func() { answers[i] = call() })
	}
	var ready string
	servertest.Eventually(t, 20*time.Second, "/readyz saying kafka is down", func() bool {
		ready = cut.readyz()
		return strings.HasPrefix(ready, "503 ") && !strings.Contains(ready, `"kafka":"ok"`) && strings.Contains(ready, `"kafka"`)
	})
	time.Sleep(time.Until(restoreAt))

	atRestore := l.counts()
	arrayedAtRestore := l.arrayed()
	ns.restore(t)
	healed := time.Now()
	var obsBack, arraysBack, readyBack time.Duration
	servertest.Eventually(t, 2*time.Minute, "acknowledged observations and arrays after the restore", func() bool {
		if obsBack == 0 && l.counts().observations > atRestore.observations {
			obsBack = time.Since(healed)
		}
		if arraysBack == 0 && l.arrayed() > arrayedAtRestore {
			arraysBack = time.Since(healed)
		}
		if readyBack == 0 && cut.readyz() == "200" {
			readyBack = time.Since(healed)
		}
		return obsBack > 0 && arraysBack > 0 && readyBack > 0
	})
	if back := max(obsBack, arraysBack); back > cutRecoverBound {
		t.Errorf("calls through the brokers acknowledged again %v after the restore, want within %v", back.Round(time.Second), cutRecoverBound)
	}
	caughtUp := v.caughtUp(t, healed)
	wg.Wait()
	for _, a := range answers {
		switch {
		case a.took > cutAnswerBound:
			t.Errorf("%s during the cut: answered after %v, want within %v (%s)", a.what, a.took.Round(time.Second), cutAnswerBound, a)
		case a.what == "publishEvent" && !a.ok():
			// A single event waits in the outbox while the broker is away.
			t.Errorf("publishEvent during the cut: %s, want its event accepted into the outbox", a)
		case a.what != "publishEvent" && a.status != http.StatusServiceUnavailable:
			t.Errorf("%s during the cut: %s, want 503", a.what, a)
		}
	}
	// The load runs on for 20 s after the restore, as TestFaults' faults do.
	time.Sleep(20*time.Second - time.Since(healed))

	for why, n := range l.failureCounts() {
		if why != "503 Service Unavailable" {
			t.Errorf("%d calls answered %q; a cut-off node answers 503 or accepts", n, why)
		}
	}
	t.Logf("fault network-cut: the node's link to the brokers down for %v; calls made as it dropped: %s; /readyz meanwhile: %s",
		cutFor, answers, ready)
	t.Logf("fault network-cut: after the restore the first acknowledged observation came %v later, array of events %v, /readyz 200 %v",
		obsBack.Round(100*time.Millisecond), arraysBack.Round(100*time.Millisecond), readyBack.Round(100*time.Millisecond))
	v.report(t, "network-cut", began, healed, caughtUp)
}

// netns is a network namespace of the test's own with two veth pairs to the host, each on a /30
// of 10.213.0.0/16: one carries the clients' HTTP to the node inside, the other the node's
// traffic to the brokers, which listen on its host end.
type netns struct {
	name            string
	node            string // the node's address, on the clients' pair
	brokers         string // the brokers' address, the host end of the brokers' pair
	clientLink      string // host end of the clients' pair
	brokerLink      string // host end of the brokers' pair, which the cut takes down
	clientNS, brkNS string // their ends inside
}

// newNetns makes the namespace and its links, and removes them when the test ends; it skips
// the test when the machine cannot make them.
func newNetns(t *testing.T) *netns {
	t.Helper()
	pid := strconv.Itoa(os.Getpid())
	n := &netns{name: "carehub-netcut-" + pid,
		clientLink: "ncc" + pid + "h", clientNS: "ncc" + pid + "n",
		brokerLink: "ncb" + pid + "h", brkNS: "ncb" + pid + "n"}
	if out, err := exec.Command("ip", "netns", "add", n.name).CombinedOutput(); err != nil {
		testenv.Missing(t, "cannot make a network namespace (ip netns add): %v: %s", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		// Deleting the namespace destroys the pairs only later; deleting a host end at once.
		for _, link := range []string{n.clientLink, n.brokerLink} {
			_ = exec.Command("ip", "link", "del", link).Run()
		}
		_ = exec.Command("ip", "netns", "del", n.name).Run()
	})
	third, block := freeSubnet(t)
	addr := func(host int) string { return fmt.Sprintf("10.213.%d.%d", third, block+host) }
	n.node, n.brokers = addr(2), addr(6)
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
	}
	for _, pair := range []struct{ host, inside, hostAddr, insideAddr string }{
		{n.clientLink, n.clientNS, addr(1), n.node},
		{n.brokerLink, n.brkNS, n.brokers, addr(5)},
	} {
		ip("link", "add", pair.host, "type", "veth", "peer", "name", pair.inside)
		ip("link", "set", pair.inside, "netns", n.name)
		ip("addr", "add", pair.hostAddr+"/30", "dev", pair.host)
		ip("link", "set", pair.host, "up")
		ip("-n", n.name, "addr", "add", pair.insideAddr+"/30", "dev", pair.inside)
		ip("-n", n.name, "link", "set", pair.inside, "up")
	}
	ip("-n", n.name, "link", "set", "lo", "up")
	t.Logf("network namespace %s: node on %s (link %s), brokers on %s (link %s)", n.name, n.node, n.clientLink, n.brokers, n.brokerLink)
	return n
}

// freeSubnet picks a /29 of 10.213.0.0/16 (two /30s) in a /24 no interface of this machine has
// an address in, so two runs at once do not clash.
func freeSubnet(t *testing.T) (third, block int) {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	pick := func(n int64) int {
		v, _ := rand.Int(rand.Reader, big.NewInt(n))
		return int(v.Int64())
	}
	for range 50 {
		third = 1 + pick(254)
		taken := false
		for _, a := range addrs {
			taken = taken || strings.HasPrefix(a.String(), fmt.Sprintf("10.213.%d.", third))
		}
		if !taken {
			return third, 8 * pick(32)
		}
	}
	t.Fatal("no free /24 in 10.213.0.0/16")
	return 0, 0
}

// cut takes the brokers' end of the pair down: the node's end stays up without a carrier, so
// what it sends to the brokers is dropped (and new connections fail once ARP gives up), while
// the brokers and the processors node, which reach the address over loopback, are untouched.
func (n *netns) cut(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("ip", "link", "set", n.brokerLink, "down").CombinedOutput(); err != nil {
		t.Fatalf("cut: %v: %s", err, out)
	}
	t.Logf("link %s down: the node is cut off from the brokers", n.brokerLink)
}

func (n *netns) restore(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("ip", "link", "set", n.brokerLink, "up").CombinedOutput(); err != nil {
		t.Fatalf("restore: %v: %s", err, out)
	}
	t.Logf("link %s up again", n.brokerLink)
}

// start runs `carehub serve` with args inside the namespace, with HTTP on the node's address, and
// waits until /readyz answers 200; as startAt, it is stopped with SIGTERM when the test ends.
// ip netns exec execs the binary, so the process is carehub itself.
func (n *netns) start(t *testing.T, name string, args ...string) *node {
	t.Helper()
	addr := net.JoinHostPort(n.node, "8080")
	args = append([]string{"netns", "exec", n.name, binary, "serve", "--http-addr", addr, "--data-dir", filepath.Join(t.TempDir(), "data")}, args...)
	return launch(t, name, addr, exec.Command("ip", args...), nil)
}

// cutAnswer is how one call made during the cut was answered.
type cutAnswer struct {
	what   string
	status int    // 0: no answer
	code   string // the error envelope's (or GraphQL extensions') code
	took   time.Duration
}

func (a cutAnswer) ok() bool { return a.status/100 == 2 && a.code == "" }

func (a cutAnswer) String() string {
	return fmt.Sprintf("%s %d %s in %v", a.what, a.status, a.code, a.took.Round(100*time.Millisecond))
}

// cutCall POSTs body as the load does and decodes the answer into out; a call acknowledged is
// counted by the caller, so the verifier looks for what it stored.
func (l *load) cutCall(what, u string, body, out any) cutAnswer {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, u, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+l.key)
	req.Header.Set("Content-Type", "application/json")
	c := http.Client{Timeout: 3 * cutAnswerBound}
	began := time.Now()
	resp, err := c.Do(req)
	a := cutAnswer{what: what}
	if err != nil {
		a.took, a.code = time.Since(began), err.Error()
		return a
	}
	defer func() { _ = resp.Body.Close() }()
	var raw bytes.Buffer
	_, _ = raw.ReadFrom(resp.Body)
	a.took, a.status = time.Since(began), resp.StatusCode
	var e struct {
		Error  struct{ Code string }
		Errors []struct{ Extensions struct{ Code string } }
	}
	_ = json.Unmarshal(raw.Bytes(), &e)
	a.code = e.Error.Code
	if len(e.Errors) > 0 {
		a.code = e.Errors[0].Extensions.Code
	}
	if a.ok() {
		_ = json.Unmarshal(raw.Bytes(), out)
	}
	return a
}

func (l *load) cutObserve() cutAnswer {
	var out struct{ IDs []string }
	a := l.cutCall("observation", "http://"+l.ingest+"/v1/observations", heartRate(), &out)
	if a.ok() {
		l.acked(out.IDs, false, false)
	}
	return a
}

// cutWorker marks the payloads of the calls made at the cut, apart from the load's workers'.
const cutWorker = 100

func (l *load) cutArray() cutAnswer {
	drafts := make([]map[string]any, arrayLen)
	for j := range drafts {
		drafts[j] = map[string]any{"projectId": l.project, "type": "integration.heartbeat",
			"payload": map[string]any{"worker": cutWorker, "seq": j}}
	}
	var out struct{ Data []struct{ ID string } }
	a := l.cutCall("array of events", "http://"+l.api+"/v1/events", drafts, &out)
	if a.ok() {
		ids := make([]string, 0, len(out.Data))
		for _, ev := range out.Data {
			ids = append(ids, ev.ID)
		}
		l.acked(ids, true, true)
	}
	return a
}

func (l *load) cutPublish() cutAnswer {
	var out struct {
		Data struct{ PublishEvent struct{ ID string } }
	}
	a := l.cutCall("publishEvent", "http://"+l.api+"/graphql", map[string]any{
		"query":     `mutation($p: ID!, $pl: JSON!) { publishEvent(type: "integration.heartbeat", payload: $pl, projectId: $p) { id } }`,
		"variables": map[string]any{"p": l.project, "pl": map[string]any{"worker": cutWorker, "seq": 0}},
	}, &out)
	if a.ok() && out.Data.PublishEvent.ID != "" {
		l.acked([]string{out.Data.PublishEvent.ID}, true, false)
	}
	return a
}
