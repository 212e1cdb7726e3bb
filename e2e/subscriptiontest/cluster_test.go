package subscriptiontest

import (
	"fmt"
	"testing"
	"time"

	"carehub/cmd/carehub/node"
	"carehub/e2e/servertest"
	"carehub/storage/demo"
)

// TestTwoNodes: two carehub instances share Postgres and Kafka; the second runs only the api
// role. A subscriber on either node sees, within a second, the events published through the
// other: every api node reads the whole events topic without a consumer group.
func TestTwoNodes(t *testing.T) {
	n1 := startNode(t)
	cfg := n1.Cfg()
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.Roles = []string{node.RoleAPI}
	n2 := wrap(servertest.StartConfig(t, cfg))
	if n1.Addr() == n2.Addr() {
		t.Fatal("both nodes listen on the same address")
	}

	key := n1.DemoKey() // keys live in the shared database: valid on both nodes
	project := n2.projectID(t, key, demo.DemoOrgSlug, demo.SepsisProjectName)
	n1.ready(t, key, project)
	n2.ready(t, key, project)

	nodes := map[string]*testNode{"node 1": n1, "node 2 (api only)": n2}
	for _, dir := range [][2]string{{"node 1", "node 2 (api only)"}, {"node 2 (api only)", "node 1"}} {
		from, to := nodes[dir[0]], nodes[dir[1]]
		t.Run("published on "+dir[0]+", subscribed on "+dir[1], func(t *testing.T) {
			subs := to.subscribeAll(t, key, eventStreamQuery, "eventStream", map[string]any{"projectId": project})
			to.waitSubscribers(t, len(subs))
			if got := from.subscribers(t); got != 0 {
				t.Fatalf("the publishing node has %d subscribers, want 0", got)
			}
			var lat []time.Duration
			ours := map[string]bool{}
			for i := range 20 {
				start := time.Now()
				pub := from.mustPublish(t, key, project, "lab.result_ready", map[string]any{"seq": i})
				ours[pub.ID] = true
				for _, p := range protocols {
					a := nextOf(t, subs[p.name], "lab.result_ready", 10*time.Second, fmt.Sprintf("%s: event %d", p.name, i))
					// A node's fan-out may still be reading events published before this
					// subscription existed (the previous direction's): those are not ours.
					for !ours[a.ev.ID] {
						a = nextOf(t, subs[p.name], "lab.result_ready", 10*time.Second, fmt.Sprintf("%s: event %d", p.name, i))
					}
					if a.ev.ID != pub.ID {
						t.Fatalf("%s: received %s, want %s", p.name, a.obj, pub.ID)
					}
					lat = append(lat, a.at.Sub(start))
				}
			}
			t.Logf("publishEvent on %s → received on %s: %s", dir[0], dir[1], latencies(lat))
		})
	}
}
