package rest_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"carehub/api/ws/wstest"
	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/models"
	"carehub/processors/inference/oip/mlservertest"
	"carehub/storage/demo"
)

// submitModelAsset submits a new MODEL asset of the demo organization and returns its id.
func submitModelAsset(t *testing.T, s *servertest.Server, key, name string) string {
	t.Helper()
	var sub struct{ SubmitAsset struct{ ID string } }
	s.MustGraphQL(t, key, `mutation($in: SubmitAssetInput!) { submitAsset(input: $in) { id } }`, map[string]any{"in": map[string]any{
		"name": name, "description": strings.Repeat("Scores deterioration on the ward. ", 8), "version": "1.0.0",
		"type": "MODEL", "category": "Early Warning", "fhirResources": []string{"Patient", "Observation"}, "pricingType": "FREE",
		"documentationUrl": "https://docs.example.org/ward", "supportEmail": "support@example.org"}}, &sub)
	return sub.SubmitAsset.ID
}

// TestAttachModelFromURL: a model named by URL and SHA-256 is downloaded, checked against the
// digest and attached with its source; a wrong digest, a URL that fails and a file over the
// limit are refused with the reason, and attach nothing.
func TestAttachModelFromURL(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	var served atomic.Int32
	files := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		switch r.URL.Path {
		case "/deterioration.onnx":
			w.Write(models.Deterioration)
		case "/moved":
			http.Redirect(w, r, "/deterioration.onnx", http.StatusFound)
		case "/huge":
			w.Header().Set("Content-Length", "40000000")
			w.Write(make([]byte, 1<<20))
		default:
			http.NotFound(w, r)
		}
	}))
	defer files.Close()
	sum := sha256.Sum256(models.Deterioration)
	digest := hex.EncodeToString(sum[:])
	id := submitModelAsset(t, s, key, "Ward Deterioration Model (fetched)")
	named := func(path, sha string) (int, string) {
		b, _ := json.Marshal(map[string]string{"url": files.URL + path, "sha256": sha})
		status, body := putModel(t, s, key, id, "application/json", b)
		return status, string(body)
	}

	if status, body := named("/deterioration.onnx", strings.Repeat("0", 64)); status != http.StatusUnprocessableEntity || !strings.Contains(body, digest) {
		t.Errorf("a wrong digest: %d %s, want 422 naming the file's", status, body)
	}
	if status, body := named("/missing.onnx", digest); status != http.StatusUnprocessableEntity || !strings.Contains(body, "HTTP 404") {
		t.Errorf("a 404: %d %s", status, body)
	}
	if status, body := named("/huge", digest); status != http.StatusRequestEntityTooLarge {
		t.Errorf("a 40 MB file: %d %s", status, body)
	}
	if status, body := named("/deterioration.onnx", "ABC"); status != http.StatusUnprocessableEntity || !strings.Contains(body, "sha256") {
		t.Errorf("a malformed digest: %d %s", status, body)
	}
	if r := s.Do(http.MethodGet, "/v1/assets/"+id+"/model", key, nil); r.Status != http.StatusNotFound {
		t.Fatalf("a refused file was attached: %d %s", r.Status, r.Body)
	}
	before := served.Load()
	if status, body := putModel(t, s, s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients), id, "application/json",
		[]byte(`{"url": "`+files.URL+`/deterioration.onnx", "sha256": "`+digest+`"}`)); status != http.StatusForbidden || served.Load() != before {
		t.Errorf("without publish:assets: %d %s (and the file was fetched: %v)", status, body, served.Load() != before)
	}

	status, body := named("/moved", digest)
	var art struct{ SHA256, SourceURL string }
	if err := json.Unmarshal([]byte(body), &art); status != http.StatusCreated || err != nil || art.SHA256 != digest || art.SourceURL != files.URL+"/moved" {
		t.Fatalf("attach from a URL: %d %s", status, body)
	}
	if r := s.Do(http.MethodGet, "/v1/assets/"+id+"/model", key, nil); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"sourceUrl"`) {
		t.Errorf("GET model: %d %s", r.Status, r.Body)
	}
	if status, body := named("/deterioration.onnx", digest); status != http.StatusOK {
		t.Errorf("the same file again, from another URL: %d %s, want 200", status, body)
	}
}

// putModel uploads content as the model of asset id.
func putModel(t *testing.T, s *servertest.Server, key, id, contentType string, content []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, s.URL+"/v1/assets/"+id+"/model", bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", contentType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// deployDemoModel deploys the Sepsis Early Warning project's installation of the demo model with
// the further createDeployment arguments args (their variables declared in decls and valued in
// vars) and waits until the deployment is RUNNING.
func deployDemoModel(t *testing.T, s *servertest.Server, key, decls, args string, vars map[string]any) string {
	t.Helper()
	installation := scalar(t, s, `select i.id from installations i join assets a on a.id = i.asset_id where i.project_id = $1 and a.name = $2`,
		s.ProjectID(demo.SepsisProjectName), demo.DeteriorationModelName)
	if vars == nil {
		vars = map[string]any{}
	}
	vars["i"] = installation
	var created struct{ CreateDeployment struct{ ID string } }
	s.MustGraphQL(t, key, `mutation($i: ID!`+decls+`) { createDeployment(installationId: $i, environment: "production", `+args+`) { id } }`,
		vars, &created)
	dep := created.CreateDeployment.ID
	servertest.Eventually(t, 10*time.Second, "the deployment RUNNING", func() bool {
		return scalar(t, s, `select status from deployments where id = $1`, dep) == "RUNNING"
	})
	return dep
}

// TestModelDeployment: the demo catalogue's model deploys, and its endpoint runs the ONNX file
// on the embedded runtime: on vitals given by name (the same probabilities as onnxruntime's own
// Python API), on tensors, and on a patient's latest stored vitals, with the patient-data rules
// of every invocation.
func TestModelDeployment(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	dep := deployDemoModel(t, s, key, "", "replicas: 2", nil)
	invoke := func(key string, body any) *servertest.Response {
		return s.Do(http.MethodPost, "/v1/deployments/"+dep+"/invoke", key, body)
	}
	type result struct {
		Runtime    string
		PatientID  string
		Redacted   bool
		Prediction *struct {
			Model          string
			Features       map[string]float64
			ObservationIDs []string
			Outputs        []struct {
				Name  string
				Shape []int64
				Data  []float64
			}
			Probability *float64
		}
	}
	decode := func(r *servertest.Response) result {
		t.Helper()
		if r.Status != http.StatusOK {
			t.Fatalf("invoke: %d %s", r.Status, r.Body)
		}
		var res result
		r.JSON(t, &res)
		return res
	}

	t.Run("vitals by name, as onnxruntime computes them", func(t *testing.T) {
		names := []string{"heart_rate", "respiratory_rate", "spo2", "systolic_bp", "temperature"}
		cases, tolerance := models.DeteriorationCases()
		for _, c := range cases {
			vitals := map[string]any{}
			for i, n := range names {
				vitals[n] = c.Input[i]
			}
			res := decode(invoke(key, map[string]any{"vitals": vitals}))
			if res.Runtime != "onnx" || res.Prediction == nil || res.Prediction.Probability == nil ||
				math.Abs(*res.Prediction.Probability-c.Output) > tolerance {
				t.Fatalf("%s: %+v, want probability %v", c.Name, res.Prediction, c.Output)
			}
		}
	})

	t.Run("tensors", func(t *testing.T) {
		all, _ := models.DeteriorationCases()
		cases := all[:3]
		var data []float64
		for _, c := range cases {
			data = append(data, c.Input...)
		}
		res := decode(invoke(key, map[string]any{"inputs": []any{map[string]any{"name": "vitals", "shape": []int{3, 5}, "datatype": "FP32", "data": data}}}))
		out := res.Prediction.Outputs
		if len(out) != 1 || out[0].Name != "probability" || len(out[0].Data) != 3 || res.Prediction.Probability != nil {
			t.Fatalf("outputs %+v", res.Prediction)
		}
		for i, c := range cases {
			if math.Abs(out[0].Data[i]-c.Output) > 1e-5 {
				t.Errorf("row %d: %v, want %v", i, out[0].Data[i], c.Output)
			}
		}
		for _, bad := range []map[string]any{
			{"inputs": []any{map[string]any{"name": "vitals", "shape": []int{1, 4}, "datatype": "FP32", "data": []float64{1, 2, 3, 4}}}},
			{"inputs": []any{map[string]any{"name": "other", "shape": []int{1, 5}, "datatype": "FP32", "data": []float64{1, 2, 3, 4, 5}}}},
			{"vitals": map[string]any{"heart_rate": 80}},
			{"inputs": []any{map[string]any{"name": "vitals", "shape": []int{1, 5}, "datatype": "FP32", "data": []float64{1, 2, 3, 4, 5}}}, "patientId": demo.StablePatientID},
			{"inputs": []any{map[string]any{"name": "vitals", "shape": []int{1, 5}, "datatype": "FP32", "data": []float64{1e39, 2, 3, 4, 5}}}},
		} {
			if r := invoke(key, bad); r.Status != http.StatusUnprocessableEntity {
				t.Errorf("%v: %d %s, want 422", bad, r.Status, r.Body)
			}
		}
	})

	t.Run("a patient's latest stored vitals, with the patient-data rules", func(t *testing.T) {
		res := decode(invoke(key, map[string]any{"patientId": demo.DeterioratingPatientID}))
		p := res.Prediction
		if p == nil || p.Probability == nil || len(p.Features) != 5 || len(p.ObservationIDs) != 5 || res.PatientID != demo.DeterioratingPatientID {
			t.Fatalf("prediction %+v", res)
		}
		stable := decode(invoke(key, map[string]any{"patientId": demo.StablePatientID}))
		if *stable.Prediction.Probability >= *p.Probability {
			t.Errorf("the stable patient's risk %v is not below the deteriorating one's %v", *stable.Prediction.Probability, *p.Probability)
		}
		// A test key does not reach a real patient; a key that may not read patients gets the
		// score redacted.
		test := s.Key(demo.DemoOrgSlug, access.Test, access.Scopes...)
		if r := invoke(test, map[string]any{"patientId": demo.RealPatientID}); r.Status != http.StatusNotFound {
			t.Errorf("a test key on a real patient: %d %s", r.Status, r.Body)
		}
		narrow := s.Key(demo.DemoOrgSlug, access.Live, access.ExecAgents)
		if r := decode(invoke(narrow, map[string]any{"patientId": demo.DeterioratingPatientID})); !r.Redacted || r.Prediction != nil || r.PatientID != "" {
			t.Errorf("exec:agents alone: %+v, want redacted", r)
		}
		other := s.Key("northwind-health", access.Live, access.Scopes...)
		if r := invoke(other, map[string]any{"vitals": map[string]any{"heart_rate": 80}}); r.Status != http.StatusNotFound {
			t.Errorf("another organization: %d %s", r.Status, r.Body)
		}
	})
}

// TestAttachModel: a publisher attaches an ONNX file to its MODEL asset under review; it is
// checked loadable, stored by its SHA-256 and frozen with the version.
func TestAttachModel(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	id := submitModelAsset(t, s, key, "Ward Deterioration Model")

	if status, body := putModel(t, s, key, id, "text/plain", models.Deterioration); status != http.StatusUnsupportedMediaType {
		t.Errorf("text/plain: %d %s", status, body)
	}
	if status, body := putModel(t, s, key, id, "application/json", models.Deterioration); status != http.StatusBadRequest {
		t.Errorf("the file's bytes as JSON: %d %s", status, body)
	}
	junk := make([]byte, 4096)
	rand.Read(junk)
	if status, body := putModel(t, s, key, id, "application/octet-stream", junk); status != http.StatusUnprocessableEntity || !strings.Contains(string(body), "not a model") {
		t.Errorf("random bytes: %d %s, want 422", status, body)
	}
	if status, body := putModel(t, s, s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients), id, "application/octet-stream", models.Deterioration); status != http.StatusForbidden {
		t.Errorf("without publish:assets: %d %s", status, body)
	}
	if status, body := putModel(t, s, s.Key("northwind-health", access.Live, access.Scopes...), id, "application/octet-stream", models.Deterioration); status != http.StatusNotFound {
		t.Errorf("another organization: %d %s", status, body)
	}
	status, body := putModel(t, s, key, id, "application/octet-stream", models.Deterioration)
	var art struct {
		SHA256, Format, Version string
		SizeBytes               int
		Signature               json.RawMessage
	}
	if err := json.Unmarshal(body, &art); status != http.StatusCreated || err != nil || art.Format != "onnx" || art.Version != "1.0.0" ||
		art.SizeBytes != len(models.Deterioration) || len(art.SHA256) != 64 {
		t.Fatalf("attach: %d %s", status, body)
	}
	// What a model records is what the demo catalogue seeds for its own.
	var got, want any
	json.Unmarshal(art.Signature, &got)
	json.Unmarshal([]byte(models.DeteriorationSignature), &want)
	if gb, _ := json.Marshal(got); string(gb) != mustCompact(t, want) {
		t.Errorf("signature %s, want %s", art.Signature, models.DeteriorationSignature)
	}
	if status, _ := putModel(t, s, key, id, "application/octet-stream", models.Deterioration); status != http.StatusOK {
		t.Errorf("the same file again: %d, want 200", status)
	}
	other := append(bytes.Clone(models.Deterioration[:len(models.Deterioration)-0]), 0) // a trailing byte: another file
	if status, body := putModel(t, s, key, id, "application/octet-stream", other); status != http.StatusConflict && status != http.StatusUnprocessableEntity {
		t.Errorf("another file for the version: %d %s, want 409 (or 422 if it does not load)", status, body)
	}
	if r := s.Do(http.MethodGet, "/v1/assets/"+id+"/model", key, nil); r.Status != http.StatusOK || !strings.Contains(string(r.Body), art.SHA256) {
		t.Errorf("GET model: %d %s", r.Status, r.Body)
	}
	// GraphQL shows it on the asset; an asset without a model has none.
	var g struct {
		Asset struct {
			Model *struct {
				Sha256    string
				SizeBytes int
				Inputs    []struct {
					Name  string
					Shape []int
				}
				Metadata map[string]string
			}
		}
		Other struct{ Model *struct{ Sha256 string } }
	}
	s.MustGraphQL(t, key, `query($a: ID!, $o: ID!) { asset(id: $a) { model { sha256 sizeBytes inputs { name shape } metadata } }
  other: asset(id: $o) { model { sha256 } } }`, map[string]any{"a": id, "o": scalar(t, s, `select id from assets where name = $1`, demo.NEWS2ModelName)}, &g)
	if m := g.Asset.Model; m == nil || m.Sha256 != art.SHA256 || m.SizeBytes != len(models.Deterioration) || len(m.Inputs) != 1 ||
		m.Inputs[0].Name != "vitals" || fmt.Sprint(m.Inputs[0].Shape) != "[-1 5]" || m.Metadata["carehub.synthetic"] != "true" || g.Other.Model != nil {
		t.Errorf("GraphQL model: %+v, other %+v", g.Asset.Model, g.Other.Model)
	}
	// Approved, the version is frozen.
	s.MustGraphQL(t, s.PlatformKey(), `mutation($a: ID!) { reviewAsset(assetId: $a, decision: "APPROVED") { id } }`, map[string]any{"a": id}, nil)
	if status, body := putModel(t, s, key, id, "application/octet-stream", models.Deterioration); status != http.StatusConflict {
		t.Errorf("after approval: %d %s, want 409", status, body)
	}
}

func mustCompact(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestBackendDeployment: a deployment that sends its invocations to an external inference server
// (a real MLServer, Open Inference Protocol v2, serving the same model) answers as the embedded
// runtime does; its credential is sealed; when the server dies invocations fail fast with a
// clear error and the deployment turns DEGRADED, and it recovers when the server returns.
func TestBackendDeployment(t *testing.T) {
	srv := mlservertest.Start(t)
	s := servertest.Start(t)
	key := s.DemoKey()
	const secret = "Bearer backend-secret-7f3a"
	dep := deployDemoModel(t, s, key, ", $b: InferenceBackendInput", "replicas: 2, backend: $b",
		map[string]any{"b": map[string]any{"protocol": "oip-v2", "url": srv.URL, "model": mlservertest.Model, "version": "1", "authorization": secret}})
	path := "/v1/deployments/" + dep + "/invoke"
	var d struct {
		Status  string
		Backend struct{ Protocol, URL, Model, Version string }
	}
	servertest.Eventually(t, 10*time.Second, "RUNNING", func() bool {
		s.Do(http.MethodGet, "/v1/deployments/"+dep, key, nil).JSON(t, &d)
		return d.Status == "RUNNING"
	})
	if d.Backend.URL != srv.URL || d.Backend.Model != mlservertest.Model || strings.Contains(string(s.Do(http.MethodGet, "/v1/deployments/"+dep, key, nil).Body), "backend-secret") {
		t.Fatalf("deployment %+v", d)
	}
	if n := scalar(t, s, `select count(*)::text from deployments where id = $1 and position('backend-secret' in encode(backend_credential, 'escape')) = 0 and backend_credential is not null`, dep); n != "1" {
		t.Error("the backend credential is stored in clear, or not at all")
	}

	cases, tolerance := models.DeteriorationCases()
	names := []string{"heart_rate", "respiratory_rate", "spo2", "systolic_bp", "temperature"}
	vitals := func(c models.Case) map[string]any {
		v := map[string]any{}
		for i, n := range names {
			v[n] = c.Input[i]
		}
		return map[string]any{"vitals": v}
	}
	for _, c := range cases[:4] {
		r := s.Do(http.MethodPost, path, key, vitals(c))
		var res struct {
			Runtime    string
			Prediction struct {
				Model   string
				Outputs []struct {
					Name, Datatype string
					Shape          []int64
					Data           []float64
				}
			}
		}
		r.JSON(t, &res)
		out := res.Prediction.Outputs
		if r.Status != http.StatusOK || res.Runtime != "oip-v2" || len(out) != 1 || len(out[0].Data) != 2 ||
			math.Abs(out[0].Data[1]-c.Output) > max(tolerance, 1e-6) {
			t.Fatalf("%s: %d %s, want P = %v", c.Name, r.Status, r.Body, c.Output)
		}
		// The server's round trip, so a client can tell carehub's time from the backend's.
		if st := r.Header.Get("Server-Timing"); !regexp.MustCompile(`^backend;dur=\d+\.\d{3}$`).MatchString(st) {
			t.Errorf("%s: Server-Timing %q, want backend;dur=<ms>", c.Name, st)
		}
	}
	if r := s.Do(http.MethodPost, path, key, map[string]any{"patientId": demo.DeterioratingPatientID}); r.Status != http.StatusOK ||
		!strings.Contains(string(r.Body), `"observationIds"`) {
		t.Fatalf("a patient's stored vitals: %d %s", r.Status, r.Body)
	}

	// The server dies: invocations fail fast, say why, and the deployment turns DEGRADED.
	srv.Kill()
	var fresh []string
	for range 6 {
		fresh = append(fresh, s.Key(demo.DemoOrgSlug, access.Live, access.ExecAgents))
	}
	start := time.Now()
	for i := range 30 {
		r := s.Do(http.MethodPost, path, fresh[i%len(fresh)], vitals(cases[0]))
		if r.Status != http.StatusServiceUnavailable || !strings.Contains(string(r.Body), "backend") {
			t.Fatalf("invocation %d with the server down: %d %s", i, r.Status, r.Body)
		}
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("30 invocations of a dead backend took %s", took)
	}
	servertest.Eventually(t, 20*time.Second, "DEGRADED", func() bool {
		s.Do(http.MethodGet, "/v1/deployments/"+dep, key, nil).JSON(t, &d)
		return d.Status == "DEGRADED"
	})
	// It returns: invocations succeed again (once the circuit lets one through), and the
	// deployment is RUNNING again.
	srv.Restart(t)
	servertest.Eventually(t, 20*time.Second, "an invocation to succeed again", func() bool {
		return s.Do(http.MethodPost, path, fresh[0], vitals(cases[0])).Status == http.StatusOK
	})
	for i := range 300 {
		if r := s.Do(http.MethodPost, path, fresh[i%len(fresh)], vitals(cases[i%len(cases)])); r.Status != http.StatusOK {
			t.Fatalf("healthy invocation %d: %d %s", i, r.Status, r.Body)
		}
	}
	servertest.Eventually(t, 20*time.Second, "RUNNING again", func() bool {
		s.Do(http.MethodGet, "/v1/deployments/"+dep, key, nil).JSON(t, &d)
		return d.Status == "RUNNING"
	})
}

// TestStreamScoring: a deployment that scores the stream runs its model when an observation of
// its organization arrives, and its deployment.prediction event reaches a subscriber, the event
// log, and an event-triggered workflow's matcher like any other event.
func TestStreamScoring(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	sepsis := s.ProjectID(demo.SepsisProjectName)
	dep := deployDemoModel(t, s, key, "", "scoreStream: true", nil)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ws, err := wstest.Dial(ctx, "ws"+strings.TrimPrefix(s.URL, "http")+"/graphql", "Bearer "+key)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	stream, err := ws.Subscribe(ctx, "predictions", `subscription($p: ID!) { eventStream(projectId: $p, types: ["deployment.prediction"]) { id type payload } }`,
		map[string]any{"p": sepsis})
	if err != nil {
		t.Fatal(err)
	}
	s.WaitSubscribers(1)

	obs := map[string]any{
		"resourceType": "Observation", "status": "final",
		"code":              map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "8867-4"}}},
		"subject":           map[string]any{"reference": "Patient/" + demo.StablePatientID},
		"effectiveDateTime": time.Now().UTC().Format(time.RFC3339),
		"valueQuantity":     map[string]any{"value": 131, "unit": "/min"},
	}
	r := s.Do(http.MethodPost, "/v1/observations", key, obs)
	if r.Status != http.StatusAccepted {
		t.Fatalf("POST /v1/observations: %d %s", r.Status, r.Body)
	}
	var ans struct{ IDs []string }
	r.JSON(t, &ans)
	select {
	case msg := <-stream:
		var ev struct {
			Data struct {
				EventStream struct {
					ID, Type string
					Payload  struct {
						DeploymentID, PatientID, ObservationID, Model string
						Probability                                   *float64
					}
				}
			}
		}
		if err := json.Unmarshal(msg, &ev); err != nil {
			t.Fatalf("%s: %v", msg, err)
		}
		p := ev.Data.EventStream.Payload
		if p.DeploymentID != dep || p.PatientID != demo.StablePatientID || len(ans.IDs) != 1 || p.ObservationID != ans.IDs[0] ||
			p.Probability == nil || *p.Probability <= 0 || *p.Probability >= 1 {
			t.Fatalf("prediction %s", msg)
		}
		// The prediction is in the event log too (whichever store holds it), once.
		servertest.Eventually(t, 10*time.Second, "the prediction in the event log", func() bool {
			var page struct{ Data []struct{ ID string } }
			s.Do(http.MethodGet, "/v1/events?projectId="+sepsis+"&type=deployment.prediction", key, nil).JSON(t, &page)
			return len(page.Data) == 1 && page.Data[0].ID == ev.Data.EventStream.ID
		})
	case <-ctx.Done():
		t.Fatal("no deployment.prediction within a minute")
	}
}
