package pipelinetest_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"carehub/internal/testenv"
	"carehub/kernel/access"
)

// TestBulkExportSurvivesKill is the Bulk Data export's crash acceptance on the real binary in
// its embedded default: Synthea's patients (make synthea-deps) loaded through /fhir/R4, a
// system export kicked off, carehub SIGKILLed once the export has committed its first file,
// then started again on the same data dir. The restarted node takes the job up when the dead
// runner's lease lapses, and the finished export holds every resource a search finds, once.
func TestBulkExportSurvivesKill(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs the carehub binary")
	}
	providers, patientFiles, ok := testenv.SyntheaBundles(t)
	if !ok {
		return
	}
	bin := buildCarehub(t)
	dir := filepath.Join(t.TempDir(), "data")
	addr := freeAddr(t)
	n := startNode(t, bin, dir, addr)
	key := createKey(t, bin, dir, access.Scopes...)
	c := &bulkClient{base: n.url() + "/fhir/R4", key: key}

	// The providers' batches first, then each patient 6 times over (Synthea's transactions
	// create new patients each time): about 21,000 resources, two files of Observations.
	for _, f := range providers {
		c.load(t, f)
	}
	for range 6 {
		for _, f := range patientFiles {
			c.load(t, f)
		}
	}
	// Observations are stored after their answer (intake → Kafka → writer): the export's
	// transaction time must come after the last of them.
	for last, deadline := -1, time.Now().Add(time.Minute); ; {
		count := c.total(t, "Observation?")
		if count == last {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("observations still being stored after a minute (%d)", count)
		}
		last = count
		time.Sleep(time.Second)
	}

	statusURL := c.kickOff(t)
	var progress string
	for deadline := time.Now().Add(time.Minute); ; {
		status, h, _ := c.get(t, statusURL)
		if status == http.StatusOK {
			t.Fatal("the export finished before the kill: the test proves nothing")
		}
		progress = h.Get("X-Progress")
		if status == http.StatusAccepted && !strings.HasSuffix(progress, " 0 resources") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no file written in a minute: %d %s", status, progress)
		}
		time.Sleep(10 * time.Millisecond)
	}
	n.kill(t)
	t.Logf("carehub SIGKILLed mid-export: %s", progress)

	n = startNode(t, bin, dir, addr)
	c.base = n.url() + "/fhir/R4"
	var m struct {
		TransactionTime string
		Output          []struct{ Type, URL string }
	}
	for deadline := time.Now().Add(2 * time.Minute); ; {
		status, _, body := c.get(t, statusURL)
		if status == http.StatusOK {
			if err := json.Unmarshal(body, &m); err != nil {
				t.Fatalf("manifest: %v %s", err, body)
			}
			break
		}
		if status != http.StatusAccepted || time.Now().After(deadline) {
			t.Fatalf("after the restart: %d %s", status, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	got := map[string]int{}
	seen := map[string]bool{}
	for _, f := range m.Output {
		status, _, body := c.get(t, f.URL)
		if status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", f.URL, status, body)
		}
		sc := bufio.NewScanner(bytes.NewReader(body))
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			var res struct{ ResourceType, ID string }
			if err := json.Unmarshal(sc.Bytes(), &res); err != nil || res.ResourceType != f.Type {
				t.Fatalf("%s: a line %.100s (%v)", f.URL, sc.Bytes(), err)
			}
			ref := res.ResourceType + "/" + res.ID
			if seen[ref] {
				t.Errorf("%s exported twice", ref)
			}
			seen[ref] = true
			got[f.Type]++
		}
	}
	for typ, count := range got { // what a search finds as of the export's transaction time
		if want := c.total(t, typ+"?_lastUpdated=lt"+url.QueryEscape(m.TransactionTime)); count != want {
			t.Errorf("%s: %d exported, a search finds %d", typ, count, want)
		}
	}
	t.Logf("after the restart: %d resources of %d types, each once", len(seen), len(got))
}

// bulkClient calls the FHIR base with a key.
type bulkClient struct{ base, key string }

func (c *bulkClient) do(t *testing.T, method, url string, body io.Reader, header ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Accept", "application/fhir+json")
	if body != nil {
		req.Header.Set("Content-Type", "application/fhir+json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

func (c *bulkClient) get(t *testing.T, url string) (int, http.Header, []byte) {
	t.Helper()
	return c.do(t, http.MethodGet, url, nil)
}

func (c *bulkClient) load(t *testing.T, file string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if status, _, out := c.do(t, http.MethodPost, c.base, bytes.NewReader(b)); status != http.StatusOK {
		t.Fatalf("load %s: %d %.300s", filepath.Base(file), status, out)
	}
}

// total counts the matches of a search ("Type?params").
func (c *bulkClient) total(t *testing.T, search string) int {
	t.Helper()
	status, _, body := c.get(t, c.base+"/"+search+"&_summary=count")
	var b struct{ Total int }
	if status != http.StatusOK || json.Unmarshal(body, &b) != nil {
		t.Fatalf("count %s: %d %s", search, status, body)
	}
	return b.Total
}

func (c *bulkClient) kickOff(t *testing.T) string {
	t.Helper()
	status, h, body := c.do(t, http.MethodGet, c.base+"/$export", nil, "Prefer", "respond-async")
	if status != http.StatusAccepted || h.Get("Content-Location") == "" {
		t.Fatalf("kick-off: %d %s", status, body)
	}
	return h.Get("Content-Location")
}
