package rest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"carehub/api/ws/wstest"
	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// statusStream collects the statuses a subscription delivers.
type statusStream struct {
	mu   sync.Mutex
	seen []string
}

func (s *statusStream) add(st string) {
	s.mu.Lock()
	s.seen = append(s.seen, st)
	s.mu.Unlock()
}

func (s *statusStream) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seen...)
}

// collect reads a subscription into st with pick extracting the status of each message.
func collect(ch <-chan json.RawMessage, st *statusStream, pick func(json.RawMessage) string) {
	go func() {
		for msg := range ch {
			if s := pick(msg); s != "" {
				st.add(s)
			}
		}
	}()
}

// inOrder reports whether want appears in got as a subsequence.
func inOrder(got, want []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// TestDeploymentLifecycle: a deployment of a runtime asset reaches RUNNING within 5 s with its
// endpoint, which answers invocations; failing invocations make it DEGRADED, healthy ones RUNNING
// again, stopDeployment STOPPED; a deploymentStatusChanged subscriber sees each of those
// transitions, and the event stream every one from PENDING.
func TestDeploymentLifecycle(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	sepsis := s.ProjectID(demo.SepsisProjectName)
	installation := scalar(t, s, `select i.id from installations i join assets a on a.id = i.asset_id where i.project_id = $1 and a.name = $2`,
		sepsis, demo.NEWS2ModelName)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ws, err := wstest.Dial(ctx, "ws"+strings.TrimPrefix(s.URL, "http")+"/graphql", "Bearer "+key)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	var streamed, changed statusStream
	evs, err := ws.Subscribe(ctx, "events", `subscription($p: ID!) { eventStream(projectId: $p, types: ["deployment.status_changed"]) { payload } }`,
		map[string]any{"p": sepsis})
	if err != nil {
		t.Fatal(err)
	}
	collect(evs, &streamed, func(m json.RawMessage) string {
		var d struct {
			Data struct {
				EventStream struct{ Payload struct{ To string } }
			}
		}
		_ = json.Unmarshal(m, &d)
		return d.Data.EventStream.Payload.To
	})
	s.WaitSubscribers(1)

	var created struct {
		CreateDeployment struct {
			ID, Status string
			Endpoint   *string
		}
	}
	s.MustGraphQL(t, key, `mutation($i: ID!) { createDeployment(installationId: $i, environment: "production", replicas: 1) { id status endpoint } }`,
		map[string]any{"i": installation}, &created)
	id := created.CreateDeployment.ID
	if created.CreateDeployment.Status != "PENDING" || created.CreateDeployment.Endpoint != nil {
		t.Fatalf("created %+v", created.CreateDeployment)
	}
	sub, err := ws.Subscribe(ctx, "dep", `subscription($d: ID!) { deploymentStatusChanged(deploymentId: $d) { id status } }`, map[string]any{"d": id})
	if err != nil {
		t.Fatal(err)
	}
	collect(sub, &changed, func(m json.RawMessage) string {
		var d struct {
			Data struct{ DeploymentStatusChanged struct{ Status string } }
		}
		_ = json.Unmarshal(m, &d)
		return d.Data.DeploymentStatusChanged.Status
	})
	s.WaitSubscribers(2)

	var dep struct {
		Status       string
		Endpoint     *string
		StatusReason *string
	}
	servertest.Eventually(t, 5*time.Second, "the deployment to run", func() bool {
		s.Do(http.MethodGet, "/v1/deployments/"+id, key, nil).JSON(t, &dep)
		return dep.Status == "RUNNING"
	})
	path := "/v1/deployments/" + id + "/invoke"
	if dep.Endpoint == nil || *dep.Endpoint != s.URL+path {
		t.Fatalf("endpoint %v, want %s", dep.Endpoint, s.URL+path)
	}

	t.Run("invoke", func(t *testing.T) {
		var res struct {
			DeploymentID, Runtime, PatientID string
			Output                           struct {
				Score          *int
				Band           string
				ObservationIDs []string
			}
			TokensUsed int
		}
		r := s.Do(http.MethodPost, path, key, map[string]any{"patientId": demo.DeterioratingPatientID})
		r.JSON(t, &res)
		if r.Status != http.StatusOK || res.Runtime != "news2" || res.Output.Score == nil || *res.Output.Score != 11 || len(res.Output.ObservationIDs) != 7 {
			t.Fatalf("HTTP %d %s", r.Status, r.Body)
		}
		r = s.Do(http.MethodPost, path, key, map[string]any{"vitals": map[string]any{"respiratory_rate": 16, "spo2": 97, "oxygen_flow": 0,
			"systolic_bp": 124, "heart_rate": 72, "gcs": 15, "temperature": map[string]any{"value": 36.8, "unit": "Cel"}}})
		r.JSON(t, &res)
		if r.Status != http.StatusOK || *res.Output.Score != 0 || res.Output.Band != "low" {
			t.Fatalf("HTTP %d %s", r.Status, r.Body)
		}
		wantError(t, s.Do(http.MethodPost, path, key, map[string]any{"vitals": map[string]any{"spo2": 97}}), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
		wantError(t, s.Do(http.MethodPost, path, key, `{"patientId": `), http.StatusBadRequest, "INVALID_REQUEST")
		wantError(t, s.Do(http.MethodPost, path, s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients),
			map[string]any{"patientId": demo.StablePatientID}), http.StatusForbidden, "INSUFFICIENT_SCOPE")
		wantError(t, s.Do(http.MethodPost, path, s.Key("northwind-health", access.Live, access.ExecAgents),
			map[string]any{"patientId": demo.StablePatientID}), http.StatusNotFound, "NOT_FOUND")
		wantError(t, s.Do(http.MethodPost, path, s.Key(demo.DemoOrgSlug, access.Test, access.ExecAgents),
			map[string]any{"patientId": demo.RealPatientID}), http.StatusNotFound, "NOT_FOUND")
	})

	t.Run("degraded and recovered", func(t *testing.T) {
		// A slow dependency: the observation reads of patient invocations wait for this lock, so
		// the one replica stays busy, its queue fills, and the rest are refused 503.
		tx, err := s.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `lock table observations in access exclusive mode`); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		codes := map[int]int{}
		retryAfter := ""
		for range 30 {
			wg.Go(func() {
				r := s.Do(http.MethodPost, path, key, map[string]any{"patientId": demo.StablePatientID})
				mu.Lock()
				codes[r.Status]++
				if r.Status == http.StatusServiceUnavailable {
					retryAfter = r.Header.Get("Retry-After")
				}
				mu.Unlock()
			})
		}
		// While the lock holds the replica, the requests beyond it and its queue are refused.
		servertest.Eventually(t, 60*time.Second, "20 refusals while the replica is busy", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return codes[http.StatusServiceUnavailable] >= 20
		})
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if codes[http.StatusServiceUnavailable] < 20 || retryAfter != "1" {
			t.Fatalf("answers %v, Retry-After %q", codes, retryAfter)
		}
		// The status is polled with a key of its own: polling spends a credential's rate limit,
		// and key is still needed for the stop below.
		watcher := s.DemoKey()
		servertest.Eventually(t, 15*time.Second, "DEGRADED", func() bool {
			s.Do(http.MethodGet, "/v1/deployments/"+id, watcher, nil).JSON(t, &dep)
			return dep.Status == "DEGRADED"
		})
		// Healthy traffic brings the failure ratio under the recovery threshold. Fresh keys, 50
		// calls each, stay within a credential's burst (100) however fast the calls go; the
		// first key spent its bucket on the overload above.
		var keys []string
		for range 8 {
			keys = append(keys, s.Key(demo.DemoOrgSlug, access.Live, access.ExecAgents))
		}
		vitals := map[string]any{"vitals": map[string]any{"respiratory_rate": 16, "spo2": 97, "oxygen_flow": 0, "systolic_bp": 124,
			"heart_rate": 72, "gcs": 15, "temperature": 36.8}}
		for i := range 400 {
			if r := s.Do(http.MethodPost, path, keys[i%len(keys)], vitals); r.Status != http.StatusOK {
				t.Fatalf("healthy invocation %d: HTTP %d %s", i, r.Status, r.Body)
			}
		}
		servertest.Eventually(t, 15*time.Second, "RUNNING again", func() bool {
			s.Do(http.MethodGet, "/v1/deployments/"+id, watcher, nil).JSON(t, &dep)
			return dep.Status == "RUNNING"
		})
	})

	t.Run("stop", func(t *testing.T) {
		s.MustGraphQL(t, key, `mutation($id: ID!) { stopDeployment(id: $id) { status } }`, map[string]any{"id": id}, nil)
		servertest.Eventually(t, 5*time.Second, "invocations refused", func() bool {
			return s.Do(http.MethodPost, path, key, map[string]any{"patientId": demo.StablePatientID}).Status == http.StatusConflict
		})
	})

	servertest.Eventually(t, 10*time.Second, "the subscribers to see every transition", func() bool {
		return inOrder(changed.get(), []string{"DEGRADED", "RUNNING", "STOPPED"}) &&
			inOrder(streamed.get(), []string{"PENDING", "RUNNING", "DEGRADED", "RUNNING", "STOPPED"})
	})
}
