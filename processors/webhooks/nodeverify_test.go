package webhooks

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"carehub/internal/testenv"
)

// signedDelivery is one input of nodeverify/verify.mjs.
type signedDelivery struct {
	Name       string            `json:"name"`
	Secret     string            `json:"secret"`
	Headers    map[string]string `json:"headers"`
	BodyBase64 string            `json:"bodyBase64"`
}

func signedFrom(name, secret string, h map[string]string, body []byte) signedDelivery {
	headers := map[string]string{}
	for k, v := range h {
		headers[strings.ToLower(k)] = v
	}
	return signedDelivery{Name: name, Secret: secret, Headers: headers, BodyBase64: base64.StdEncoding.EncodeToString(body)}
}

func (r request) signed(name, secret string) signedDelivery {
	h := map[string]string{}
	for k := range r.Header {
		h[k] = r.Header.Get(k)
	}
	return signedFrom(name, secret, h, r.Body)
}

// verifyWithNode runs the reference verifier on ds and returns its exit code and the names it
// rejected. It skips the test only when node is not installed.
func verifyWithNode(t *testing.T, ds []signedDelivery) (int, []string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Missing(t, "node is not installed: the Standard Webhooks reference verifier (nodeverify/) cannot run")
	}
	dir, err := filepath.Abs("nodeverify")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "standardwebhooks")); err != nil {
		npm := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
		npm.Dir = dir
		if out, err := npm.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	in, err := json.Marshal(ds)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, filepath.Join(dir, "verify.mjs"))
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("run verify.mjs: %v", err)
		}
		code = ee.ExitCode()
	}
	if code == 2 {
		t.Fatalf("verify.mjs refused its input: %s", stderr.String())
	}
	var rejected []string
	seen := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var line struct {
			Name  string `json:"name"`
			OK    bool   `json:"ok"`
			Error string `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("verify.mjs output %q: %v", sc.Text(), err)
		}
		seen++
		if !line.OK {
			rejected = append(rejected, line.Name)
			t.Logf("reference verifier rejected %s: %s", line.Name, line.Error)
		}
	}
	if seen != len(ds) {
		t.Fatalf("verify.mjs reported %d deliveries, want %d (stderr: %s)", seen, len(ds), stderr.String())
	}
	return code, rejected
}

func TestReferenceVerifierAcceptsEveryDelivery(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		testenv.Missing(t, "node is not installed: the Standard Webhooks reference verifier (nodeverify/) cannot run")
	}
	f := newFixture(t)
	rc := newReceiver(t, nil)
	sub := f.createWith(oneAtATime(), rc.URL, "*") // reqs[0] is the first event's
	f.start()

	f.publish("agent.run_completed", map[string]any{"sessionId": "ses_1", "latencyMs": 120, "tokensUsed": 512})
	f.publish("diagnostic.result_ready", map[string]any{"conclusion": "Température élevée ✓ 体温 38.9 °C", "note": "line\nbreak \"quoted\" \\ </script>"})
	reqs := rc.waitRequests(t, 2, 20*time.Second)
	rotated, err := f.svc.RotateSecret(f.admin, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	f.publish("workflow.run.completed", map[string]any{"run_id": "run_9", "status": "FAILED"})
	rotatedReq := rc.waitRequests(t, 3, 20*time.Second)[2]

	ds := []signedDelivery{
		reqs[0].signed("plain", sub.Secret),
		reqs[1].signed("non-ascii", sub.Secret),
		rotatedReq.signed("rotation/new-secret", rotated.Secret),
		rotatedReq.signed("rotation/old-secret", sub.Secret),
	}
	// A test send to a URL, signed with its one-off secret.
	res, err := f.svc.Test(f.admin, TestRequest{URL: rc.URL})
	if err != nil {
		t.Fatal(err)
	}
	ds = append(ds, signedFrom("test-send", res.Secret, res.Request.Headers, []byte(res.Request.Body)))

	if code, rejected := verifyWithNode(t, ds); code != 0 || len(rejected) != 0 {
		t.Fatalf("reference verifier: exit %d, rejected %v; want every delivery accepted", code, rejected)
	}

	// The same check fails for a delivery whose body was changed after signing, and for a
	// signature checked with a secret that did not make it.
	tampered := reqs[0].signed("tampered-body", sub.Secret)
	body := bytes.Replace(reqs[0].Body, []byte(`"latencyMs":120`), []byte(`"latencyMs":121`), 1)
	if bytes.Equal(body, reqs[0].Body) {
		t.Fatal("tampering changed nothing")
	}
	tampered.BodyBase64 = base64.StdEncoding.EncodeToString(body)
	wrongSecret := reqs[1].signed("wrong-secret", rotated.Secret)
	code, rejected := verifyWithNode(t, append(ds, tampered, wrongSecret))
	if code != 1 || strings.Join(rejected, ",") != "tampered-body,wrong-secret" {
		t.Fatalf("reference verifier: exit %d, rejected %v; want exit 1 rejecting exactly the tampered delivery and the wrong secret", code, rejected)
	}
}
