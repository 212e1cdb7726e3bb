package webhooks

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"carehub/internal/testenv"
	"carehub/kernel/whsig"
)

// The harness each documented recipe runs under: it reads []signedDelivery as JSON on stdin and
// prints "name True" or "name False" per delivery, as the recipe's verify answered.
var docHarness = map[string]struct {
	file, harness string
	run           func(dir string) *exec.Cmd
}{
	"python": {"verify.py", `
import base64, json, sys
for d in json.load(sys.stdin):
    print(d["name"], verify(d["secret"], d["headers"], base64.b64decode(d["bodyBase64"])))
`, func(dir string) *exec.Cmd { return exec.Command("python3", filepath.Join(dir, "verify.py")) }},
	"js": {"verify.js", `
const deliveries = JSON.parse(require("node:fs").readFileSync(0, "utf8"));
for (const d of deliveries) {
  console.log(d.name, verify(d.secret, d.headers, Buffer.from(d.bodyBase64, "base64")) ? "True" : "False");
}
`, func(dir string) *exec.Cmd { return exec.Command("node", filepath.Join(dir, "verify.js")) }},
	"go": {"verify.go", `
func main() {
	var ds []struct {
		Name       string            ` + "`json:\"name\"`" + `
		Secret     string            ` + "`json:\"secret\"`" + `
		Headers    map[string]string ` + "`json:\"headers\"`" + `
		BodyBase64 string            ` + "`json:\"bodyBase64\"`" + `
	}
	if err := json.NewDecoder(os.Stdin).Decode(&ds); err != nil {
		panic(err)
	}
	for _, d := range ds {
		h := http.Header{}
		for k, v := range d.Headers {
			h.Set(k, v)
		}
		body, _ := base64.StdEncoding.DecodeString(d.BodyBase64)
		if Verify(d.Secret, h, body) {
			fmt.Println(d.Name, "True")
		} else {
			fmt.Println(d.Name, "False")
		}
	}
}
`, func(dir string) *exec.Cmd {
		return exec.Command("go", "run", filepath.Join(dir, "verify.go"), filepath.Join(dir, "main.go"))
	}},
}

// docRecipes returns the fenced code blocks of docs/WEBHOOKS.md by language.
func docRecipes(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../../docs/WEBHOOKS.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range regexp.MustCompile("(?s)```(python|js|go)\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		if _, dup := out[m[1]]; dup {
			t.Fatalf("docs/WEBHOOKS.md has two %s blocks", m[1])
		}
		out[m[1]] = m[2]
	}
	return out
}

// TestDocumentedVerifiers runs every verification recipe of docs/WEBHOOKS.md, verbatim, on real
// deliveries (one during a secret rotation, so signed twice) and on forgeries of them.
func TestDocumentedVerifiers(t *testing.T) {
	recipes := docRecipes(t)
	if got := slices.Sorted(func(yield func(string) bool) {
		for k := range recipes {
			if !yield(k) {
				return
			}
		}
	}); !slices.Equal(got, []string{"go", "js", "python"}) {
		t.Fatalf("docs/WEBHOOKS.md recipes: %v, want go, js and python", got)
	}

	f := newFixture(t)
	rc := newReceiver(t, nil)
	sub := f.create(rc.URL, "*")
	f.start()
	f.publish("agent.run_completed", map[string]any{"sessionId": "ses_1"})
	first := rc.waitRequests(t, 1, 20*time.Second)[0]
	rotated, err := f.svc.RotateSecret(f.admin, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	f.publish("workflow.run.completed", map[string]any{"run_id": "run_9", "status": "FAILED"})
	during := rc.waitRequests(t, 2, 20*time.Second)[1]
	if n := len(strings.Fields(during.Header.Get(whsig.HeaderSignature))); n != 2 {
		t.Fatalf("a delivery during rotation carries %d signatures, want 2", n)
	}

	forged := first
	forged.Body = bytes.Replace(first.Body, []byte("ses_1"), []byte("ses_2"), 1)
	if bytes.Equal(forged.Body, first.Body) {
		t.Fatalf("the delivered body lacks the reading to alter: %s", first.Body)
	}
	stale := first.signed("stale", sub.Secret)
	old := time.Now().Add(-time.Hour)
	sig, err := whsig.Sign(first.id(), old, first.Body, sub.Secret)
	if err != nil {
		t.Fatal(err)
	}
	stale.Headers[whsig.HeaderTimestamp], stale.Headers[whsig.HeaderSignature] = strconv.FormatInt(old.Unix(), 10), sig
	cases := []signedDelivery{
		first.signed("delivery", sub.Secret),
		during.signed("rotation-new-secret", rotated.Secret),
		during.signed("rotation-old-secret", sub.Secret),
		forged.signed("tampered-body", sub.Secret),
		first.signed("wrong-secret", rotated.Secret),
		stale,
	}
	want := "delivery True\nrotation-new-secret True\nrotation-old-secret True\ntampered-body False\nwrong-secret False\nstale False\n"
	in, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}

	for lang, h := range docHarness {
		t.Run(lang, func(t *testing.T) {
			tool := map[string]string{"python": "python3", "js": "node", "go": "go"}[lang]
			if _, err := exec.LookPath(tool); err != nil {
				testenv.Missing(t, "%s is not installed: docs/WEBHOOKS.md's %s recipe cannot run", tool, lang)
			}
			dir := t.TempDir()
			src := recipes[lang] + h.harness
			if lang == "go" {
				// The recipe is a file of package receiver; the harness makes it a command.
				src = strings.Replace(recipes[lang], "package receiver", "package main", 1)
				main := "package main\n\nimport (\n\t\"encoding/base64\"\n\t\"encoding/json\"\n\t\"fmt\"\n\t\"net/http\"\n\t\"os\"\n)\n" + h.harness
				if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(main), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(dir, h.file), []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := h.run(dir)
			cmd.Dir = dir
			cmd.Stdin = bytes.NewReader(in)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s recipe: %v\n%s", lang, err, stderr.String())
			}
			if string(out) != want {
				t.Errorf("%s recipe answered\n%s\nwant\n%s", lang, out, want)
			}
		})
	}
}
