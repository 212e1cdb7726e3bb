package fhir_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/internal/testenv"
)

// TestSyntheaTransactions loads patients made by Synthea, the published generator (Maven
// Central, a fixed seed: tests/synthea), as a FHIR client would: the hospital and practitioner
// Bundles as published (batches of conditional creates), then each patient's transaction Bundle
// posted to the base. Every entry must be stored; each is read back by the id in the
// transaction-response and compared with what was posted, its urn:uuid and conditional
// references resolved; Patient/{id}/$everything must return all of it; and every resource
// carehub returned is validated by HAPI's FhirInstanceValidator (tests/fhir-client, validate
// mode). The log quotes the import rate. Issue 52's acceptance.
func TestSyntheaTransactions(t *testing.T) {
	providers, patients, ok := testenv.SyntheaBundles(t)
	if !ok {
		return
	}

	s := servertest.Start(t)
	c := &synClient{base: s.URL + "/fhir/R4", key: s.DemoKey()}
	ctx := t.Context()
	returned := t.TempDir() // every resource carehub answered, for HAPI's validator

	// Conditional references ("Practitioner?identifier=sys|value") as the stored "Type/id".
	conditional := map[string]string{}
	refused := map[string][]string{}
	for _, f := range providers {
		b := synReadBundle(t, f)
		status, body := c.post(ctx, "/", b.raw)
		resp, err := synParseBundle(body)
		if status != http.StatusOK || err != nil {
			t.Errorf("%s (%s of %d entries): %d %s", filepath.Base(f), b.Type, len(b.Entry), status, synOutcome(body))
			continue
		}
		synSave(t, returned, "provider-"+filepath.Base(f), body)
		for i, e := range b.Entry {
			var loc string
			if i < len(resp.Entry) && resp.Entry[i].Response != nil {
				loc = synTypeID(resp.Entry[i].Response.Location)
			}
			if loc == "" {
				refused[synType(e.Resource)] = append(refused[synType(e.Resource)], fmt.Sprintf("%s entry %d: %s", filepath.Base(f), i, synEntryAnswer(resp, i)))
				continue
			}
			var r struct {
				ResourceType string `json:"resourceType"`
				Identifier   []struct{ System, Value string }
			}
			_ = json.Unmarshal(e.Resource, &r)
			for _, id := range r.Identifier {
				conditional[r.ResourceType+"?identifier="+id.System+"|"+id.Value] = loc
			}
		}
	}
	synReport(t, refused)

	type loaded struct {
		name    string
		bundle  *synBundle
		ids     map[string]string // fullUrl → "Type/id"
		patient string            // "Patient/id"
	}
	var done []loaded
	var entries, stored, txs int
	var took, waits time.Duration
	for _, f := range patients {
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		b := synReadBundle(t, f)
		entries += len(b.Entry)
		if b.Type != "transaction" {
			t.Fatalf("%s: a %s Bundle, Synthea's are transactions (tests/synthea/generate.sh)", name, b.Type)
		}
		start, waited := time.Now(), c.waited
		status, body := c.post(ctx, "/", b.raw)
		elapsed, slept := time.Since(start), c.waited-waited
		resp, err := synParseBundle(body)
		if status != http.StatusOK || err != nil || resp.Type != "transaction-response" || len(resp.Entry) != len(b.Entry) {
			t.Errorf("%s: the transaction of %d entries (%s) was not stored whole: %d %s",
				name, len(b.Entry), synTypes(b), status, synOutcome(body))
			if !synByEntry(t, b, body) && status != http.StatusServiceUnavailable {
				synDiagnose(t, ctx, c, name, b)
			}
			continue
		}
		synSave(t, returned, "transaction-response-"+name, body)
		l := loaded{name: name, bundle: b, ids: map[string]string{}}
		var bad []string
		for i, e := range b.Entry {
			loc := synTypeID(resp.Entry[i].Response.Location)
			if !strings.HasPrefix(resp.Entry[i].Response.Status, "201") || loc == "" || !strings.HasPrefix(loc, synType(e.Resource)+"/") {
				bad = append(bad, fmt.Sprintf("entry %d (%s): %s", i, synType(e.Resource), synEntryAnswer(resp, i)))
				continue
			}
			l.ids[e.FullURL] = loc
			if synType(e.Resource) == "Patient" {
				l.patient = loc
			}
		}
		if len(bad) > 0 {
			t.Errorf("%s: %d of %d entries of an accepted transaction not created:\n  %s", name, len(bad), len(b.Entry), strings.Join(bad, "\n  "))
			continue
		}
		txs++
		stored += len(b.Entry)
		took += elapsed
		waits += slept
		done = append(done, l)
	}
	if took > 0 {
		t.Logf("Synthea import: %d resources in %d transactions (%d patients, one client, sequential) in %s: %.0f resources/s acknowledged",
			stored, txs, len(patients), took.Round(time.Millisecond), float64(stored)/took.Seconds())
		if waits > 0 && took > waits {
			t.Logf("Synthea import: %s of it waiting as 429/503 answers told; %.0f resources/s without the waits",
				waits.Round(time.Millisecond), float64(stored)/(took-waits).Seconds())
		}
	}
	t.Logf("Synthea: %d of %d patient entries stored in %d of %d transactions", stored, entries, txs, len(patients))

	// Read back, resource for resource: what was posted, with its references resolved.
	for _, l := range done {
		t.Run("read back "+l.name, func(t *testing.T) {
			resolve := func(ref string) string {
				if v, ok := l.ids[ref]; ok {
					return v
				}
				if v, ok := conditional[ref]; ok {
					return v
				}
				return ref
			}
			failures := map[string][]string{} // by resource type
			added := map[string]int{}         // "Type.path" → count
			example := map[string]string{}    // "Type.path" → the first value read
			var same int
			for i, e := range l.bundle.Entry {
				loc := l.ids[e.FullURL]
				status, body := c.getEventually(ctx, "/"+loc)
				if status != http.StatusOK {
					failures[synType(e.Resource)] = append(failures[synType(e.Resource)], fmt.Sprintf("entry %d GET %s: %d %s", i, loc, status, synOutcome(body)))
					continue
				}
				synSave(t, returned, fmt.Sprintf("%s-%04d-%s", l.name, i, strings.ReplaceAll(loc, "/", "-")), body)
				want, err := synDecode(e.Resource)
				if err != nil {
					t.Fatal(err)
				}
				got, err := synDecode(body)
				if err != nil {
					failures[synType(e.Resource)] = append(failures[synType(e.Resource)], fmt.Sprintf("entry %d GET %s: not JSON: %v", i, loc, err))
					continue
				}
				diffs, extra := synCompare(synResolved(want, resolve), got, loc)
				for _, a := range extra {
					path, value, _ := strings.Cut(a, ": ")
					k := synType(e.Resource) + path
					if added[k]++; added[k] == 1 {
						example[k] = value
					}
				}
				if len(diffs) > 0 {
					failures[synType(e.Resource)] = append(failures[synType(e.Resource)], fmt.Sprintf("entry %d %s: %s", i, loc, strings.Join(diffs, "; ")))
					continue
				}
				same++
			}
			t.Logf("%s: %d of %d resources read back as posted", l.name, same, len(l.bundle.Entry))
			if len(added) > 0 {
				// What carehub adds to a resource is no loss; the log shows it for review.
				keys := make([]string, 0, len(added))
				for k := range added {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				var b strings.Builder
				for _, k := range keys {
					fmt.Fprintf(&b, "\n  %d× %s, e.g. %s", added[k], k, example[k])
				}
				t.Logf("%s: elements carehub added that were not posted:%s", l.name, b.String())
			}
			synReport(t, failures)
		})

		t.Run("$everything "+l.name, func(t *testing.T) {
			want := map[string]bool{}
			for _, loc := range l.ids {
				want[loc] = true
			}
			got := map[string]bool{}
			next := "/" + l.patient + "/$everything"
			page := 0
			for ; next != ""; page++ {
				status, body := c.get(ctx, next)
				b, err := synParseBundle(body)
				if status != http.StatusOK || err != nil || b.Type != "searchset" {
					t.Fatalf("GET %s: %d %s", next, status, synOutcome(body))
				}
				if page == 0 {
					// The searchset's shape; its resources are validated as read one by one above
					// (validating every page again would double the validator's minutes).
					synSave(t, returned, "everything-"+l.name, body)
				}
				for _, e := range b.Entry {
					var r struct{ ResourceType, ID string }
					_ = json.Unmarshal(e.Resource, &r)
					got[r.ResourceType+"/"+r.ID] = true
				}
				next = ""
				for _, lk := range b.Link {
					if lk.Relation == "next" {
						next = lk.URL
					}
				}
				if page > 1000 {
					t.Fatalf("$everything: more than 1000 pages")
				}
			}
			t.Logf("%s/$everything: %d resources in %d pages", l.patient, len(got), page)
			missing := map[string]int{}
			var n int
			for loc := range want {
				if !got[loc] {
					missing[strings.Split(loc, "/")[0]]++
					n++
				}
			}
			if n > 0 {
				t.Errorf("%s/$everything: %d of the transaction's %d resources missing (by type: %v)", l.patient, n, len(want), missing)
			}
		})
	}

	if len(c.retries) > 0 {
		t.Logf("requests retried as their answers told (count by answer): %v", c.retries)
	}

	// Issue 57: a Patient-level Bulk Data export, as a Bulk Data client makes it (kick-off,
	// polls honouring Retry-After, manifest, files), holds every resource of every patient's
	// transaction exactly once.
	t.Run("bulk export", func(t *testing.T) {
		start := time.Now()
		m := awaitManifest(t, kickOff(t, s, "/fhir/R4/Patient/$export", c.key), c.key)
		got := download(t, m, c.key) // fails on a resource exported twice
		var n int
		exported := map[string]bool{}
		for typ, list := range got {
			for _, res := range list {
				exported[typ+"/"+res["id"].(string)] = true
				n++
			}
		}
		t.Logf("Patient/$export: %d resources in %d files in %s", n, len(m.Output), time.Since(start).Round(time.Millisecond))
		missing := map[string]int{}
		for _, l := range done {
			for _, loc := range l.ids {
				if !exported[loc] {
					missing[strings.Split(loc, "/")[0]]++
				}
			}
		}
		if len(missing) > 0 {
			t.Errorf("Patient/$export misses stored resources (by type): %v", missing)
		}
	})

	t.Run("HAPI validator", func(t *testing.T) {
		n, _ := filepath.Glob(filepath.Join(returned, "*.json"))
		if len(n) == 0 {
			t.Fatalf("carehub returned nothing to validate")
		}
		synValidate(t, returned, len(n))
	})
}

// synDiagnose posts a refused transaction again as a batch, entry by entry, to say which
// entries carehub refuses and why (a transaction's OperationOutcome names the first only).
func synDiagnose(t *testing.T, ctx context.Context, c *synClient, name string, b *synBundle) {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(b.raw, &doc); err != nil {
		t.Fatal(err)
	}
	doc["type"] = "batch"
	raw, _ := json.Marshal(doc)
	status, body := c.post(ctx, "/", raw)
	resp, err := synParseBundle(body)
	if status != http.StatusOK || err != nil || len(resp.Entry) != len(b.Entry) {
		t.Logf("%s as a batch (diagnosis): %d %s", name, status, synOutcome(body))
		return
	}
	refused := map[string][]string{}
	var ok int
	for i, e := range b.Entry {
		r := resp.Entry[i].Response
		if r != nil && strings.HasPrefix(r.Status, "2") {
			ok++
			continue
		}
		refused[synType(e.Resource)] = append(refused[synType(e.Resource)], fmt.Sprintf("entry %d: %s", i, synEntryAnswer(resp, i)))
	}
	t.Logf("%s as a batch (diagnosis; an entry naming another by urn:uuid fails in a batch by design): %d of %d entries accepted", name, ok, len(b.Entry))
	synReport(t, refused)
}

// synByEntry fails t with a refused transaction's OperationOutcome issues that name an entry
// (Bundle.entry[i]), by the entry's resource type; false when none names one.
func synByEntry(t *testing.T, b *synBundle, body []byte) bool {
	t.Helper()
	var oo struct {
		Issue []struct {
			Code, Diagnostics string
			Expression        []string
		} `json:"issue"`
	}
	if json.Unmarshal(body, &oo) != nil {
		return false
	}
	byType := map[string][]string{}
	for _, is := range oo.Issue {
		for _, x := range is.Expression {
			var i int
			if _, err := fmt.Sscanf(x, "Bundle.entry[%d]", &i); err != nil || i < 0 || i >= len(b.Entry) {
				continue
			}
			typ := synType(b.Entry[i].Resource)
			byType[typ] = append(byType[typ], fmt.Sprintf("%s: %s %q", x, is.Code, is.Diagnostics))
			break
		}
	}
	synReport(t, byType)
	return len(byType) > 0
}

// synReport fails t with failures by resource type: the count and the first three.
func synReport(t *testing.T, failures map[string][]string) {
	t.Helper()
	types := make([]string, 0, len(failures))
	for k := range failures {
		types = append(types, k)
	}
	sort.Strings(types)
	for _, k := range types {
		f := failures[k]
		t.Errorf("%s: %d failed, e.g.\n  %s", k, len(f), strings.Join(f[:min(3, len(f))], "\n  "))
	}
}

// synValidate runs tests/fhir-client's validate mode (HAPI's FhirInstanceValidator, offline) on
// every file in dir.
func synValidate(t *testing.T, dir string, n int) {
	mvn, err := exec.LookPath("mvn")
	if err != nil {
		testenv.Missing(t, "mvn not found (HAPI's validator needs Java 17 and Maven): run make test-deps")
		return
	}
	repo := m2Repo()
	if _, err := os.Stat(filepath.Join(repo, "ca", "uhn", "hapi", "fhir", "hapi-fhir-validation")); err != nil {
		testenv.Missing(t, "HAPI FHIR is not in %s: run make fhir-client-deps (or make test-deps)", repo)
		return
	}
	cmd := exec.CommandContext(t.Context(), mvn, "-B", "-q", "-o", "-Dstyle.color=never", "-Dmaven.repo.local="+repo,
		"-f", "../../tests/fhir-client/pom.xml", "compile", "exec:java@validate", "-Dexec.args="+dir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	var failed []string
	var summary string
	for _, line := range strings.Split(out.String(), "\n") {
		switch {
		case strings.HasPrefix(line, "FAIL "):
			failed = append(failed, line)
		case strings.HasSuffix(line, " failed"):
			summary = line
		}
	}
	t.Logf("HAPI validator on %d documents carehub returned: %s", n, summary)
	if len(failed) > 0 {
		t.Errorf("%d not valid R4, e.g.\n%s", len(failed), strings.Join(failed[:min(10, len(failed))], "\n"))
	}
	if err != nil || summary == "" {
		t.Fatalf("the validator: %v\n%s", err, synTail(out.String(), 4000))
	}
}

// synClient is a FHIR client of the node under test: JSON, a bearer key, and 429s and 503s
// waited out as their Retry-After says (1 s without one), for up to a minute a request, as a
// client that is told to retry does (the key's rate limit applies to a test as to anyone; a 503
// is the ingest's backpressure). retries counts them by status and Retry-After, for the log.
type synClient struct {
	base, key string
	retries   map[string]int // "status Retry-After: value" → count
	waited    time.Duration  // sleeping as 429s and 503s told
}

// do sends method to path (under the base, or an absolute link) and returns the answer's
// status and body; a transport error is status 0 with the error as the body.
func (c *synClient) do(ctx context.Context, method, path string, body []byte) (int, []byte) {
	giveUp := time.Now().Add(time.Minute)
	for {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		u := c.base + path
		if strings.HasPrefix(path, "http://") || strings.HasPrefix(path, "https://") {
			u = path // a link the server gave
		}
		req, err := http.NewRequestWithContext(ctx, method, u, rd)
		if err != nil {
			return 0, []byte(err.Error())
		}
		req.Header.Set("Authorization", "Bearer "+c.key)
		req.Header.Set("Accept", "application/fhir+json")
		if body != nil {
			req.Header.Set("Content-Type", "application/fhir+json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, []byte(err.Error())
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return 0, []byte(err.Error())
		}
		if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(giveUp) {
			return resp.StatusCode, b
		}
		if c.retries == nil {
			c.retries = map[string]int{}
		}
		c.retries[fmt.Sprintf("%d Retry-After: %q", resp.StatusCode, resp.Header.Get("Retry-After"))]++
		wait := time.Second
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			wait = time.Duration(s) * time.Second
		}
		select {
		case <-ctx.Done():
			return resp.StatusCode, b
		case <-time.After(wait):
			c.waited += wait
		}
	}
}

func (c *synClient) post(ctx context.Context, path string, body []byte) (int, []byte) {
	return c.do(ctx, http.MethodPost, path, body)
}

func (c *synClient) get(ctx context.Context, path string) (int, []byte) {
	return c.do(ctx, http.MethodGet, path, nil)
}

// getEventually reads path, waiting up to 30 s for a 404 to turn into a resource: carehub
// acknowledges some writes (observations) once its log holds them, before a read sees them.
func (c *synClient) getEventually(ctx context.Context, path string) (int, []byte) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		status, body := c.get(ctx, path)
		if status != http.StatusNotFound || time.Now().After(deadline) {
			return status, body
		}
		select {
		case <-ctx.Done():
			return status, body
		case <-time.After(100 * time.Millisecond):
		}
	}
}

type synEntry struct {
	FullURL  string          `json:"fullUrl"`
	Resource json.RawMessage `json:"resource"`
	Response *struct {
		Status   string          `json:"status"`
		Location string          `json:"location"`
		Outcome  json.RawMessage `json:"outcome"`
	} `json:"response"`
}

type synBundle struct {
	ResourceType string     `json:"resourceType"`
	Type         string     `json:"type"`
	Entry        []synEntry `json:"entry"`
	Link         []struct {
		Relation string `json:"relation"`
		URL      string `json:"url"`
	} `json:"link"`
	raw []byte
}

func synReadBundle(t *testing.T, path string) *synBundle {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := synParseBundle(raw)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return b
}

func synParseBundle(raw []byte) (*synBundle, error) {
	var b synBundle
	if err := json.Unmarshal(raw, &b); err != nil {
		return nil, err
	}
	if b.ResourceType != "Bundle" {
		return nil, fmt.Errorf("a %q, not a Bundle", b.ResourceType)
	}
	b.raw = raw
	return &b, nil
}

// synTypes counts a Bundle's entries by resource type.
func synTypes(b *synBundle) string {
	n := map[string]int{}
	for _, e := range b.Entry {
		n[synType(e.Resource)]++
	}
	keys := make([]string, 0, len(n))
	for k := range n {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, n[k])
	}
	return strings.Join(parts, ", ")
}

func synType(raw json.RawMessage) string {
	var r struct {
		ResourceType string `json:"resourceType"`
	}
	_ = json.Unmarshal(raw, &r)
	return r.ResourceType
}

// synTypeID is "Type/id" of a location or full URL (absolute, relative, with _history or not).
func synTypeID(loc string) string {
	if u, err := url.Parse(loc); err == nil && u.Scheme != "" {
		loc = u.Path
	}
	loc, _, _ = strings.Cut(loc, "/_history")
	parts := strings.Split(strings.Trim(loc, "/"), "/")
	if len(parts) < 2 {
		return ""
	}
	return parts[len(parts)-2] + "/" + parts[len(parts)-1]
}

// synOutcome is an answer in brief: an OperationOutcome's issues, or the body's start.
func synOutcome(body []byte) string {
	var oo struct {
		ResourceType string `json:"resourceType"`
		Issue        []struct {
			Severity, Code, Diagnostics string
			Expression                  []string
		} `json:"issue"`
	}
	if json.Unmarshal(body, &oo) == nil && oo.ResourceType == "OperationOutcome" {
		var parts []string
		for n, i := range oo.Issue {
			if n == 5 {
				parts = append(parts, fmt.Sprintf("and %d more issues", len(oo.Issue)-n))
				break
			}
			parts = append(parts, fmt.Sprintf("%s/%s %q at %v", i.Severity, i.Code, i.Diagnostics, i.Expression))
		}
		return "OperationOutcome: " + strings.Join(parts, "; ")
	}
	return synTail(string(body), 300)
}

func synEntryAnswer(b *synBundle, i int) string {
	if i >= len(b.Entry) || b.Entry[i].Response == nil {
		return "no response entry"
	}
	r := b.Entry[i].Response
	s := r.Status
	if r.Location != "" {
		s += " " + r.Location
	}
	if len(r.Outcome) > 0 {
		s += " " + synOutcome(r.Outcome)
	}
	return s
}

func synTail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

func synSave(t *testing.T, dir, name string, body []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name+".json"), body, 0o600); err != nil {
		t.Fatal(err)
	}
}

func synDecode(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// synResolved is v with every reference string passed through resolve.
func synResolved(v any, resolve func(string) string) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			if s, ok := e.(string); ok && k == "reference" {
				out[k] = resolve(s)
				continue
			}
			out[k] = synResolved(e, resolve)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = synResolved(e, resolve)
		}
		return out
	}
	return v
}

// synCompare lists where a read resource differs from the posted one (diffs: a posted element
// lost or changed) and the elements the server added (added: each as ".path: value"). id and
// meta are the server's (a create ignores the client's); everything posted must come back, with
// equal numbers and equal instants in the same offset.
func synCompare(want, got any, loc string) (diffs, added []string) {
	w, _ := want.(map[string]any)
	g, _ := got.(map[string]any)
	if g == nil {
		return []string{"not a JSON object"}, nil
	}
	if id, _ := g["id"].(string); loc != "" && w["resourceType"] != nil && fmt.Sprint(w["resourceType"])+"/"+id != loc {
		diffs = append(diffs, fmt.Sprintf("id %q, read at %s", id, loc))
	}
	w, g = synWithout(w, "id", "meta"), synWithout(g, "id", "meta")
	synDiff("", w, g, &diffs, &added)
	if len(diffs) > 8 {
		diffs = append(diffs[:8], fmt.Sprintf("and %d more", len(diffs)-8))
	}
	return diffs, added
}

func synWithout(m map[string]any, keys ...string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if !slices.Contains(keys, k) {
			out[k] = v
		}
	}
	return out
}

func synDiff(path string, want, got any, diffs, added *[]string) {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			*diffs = append(*diffs, fmt.Sprintf("%s: posted an object, read %s", path, synShort(got)))
			return
		}
		keys := make([]string, 0, len(w)+len(g))
		for k := range w {
			keys = append(keys, k)
		}
		for k := range g {
			if _, ok := w[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			wv, inW := w[k]
			gv, inG := g[k]
			switch {
			case !inG:
				*diffs = append(*diffs, fmt.Sprintf("%s.%s: posted %s, read nothing", path, k, synShort(wv)))
			case !inW:
				*added = append(*added, fmt.Sprintf("%s.%s: %s", synGeneric(path), k, synTail(synShort(gv), 60)))
			default:
				synDiff(path+"."+k, wv, gv, diffs, added)
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			*diffs = append(*diffs, fmt.Sprintf("%s: posted %s, read %s", path, synShort(want), synShort(got)))
			return
		}
		for i := range w {
			synDiff(fmt.Sprintf("%s[%d]", path, i), w[i], g[i], diffs, added)
		}
	case json.Number:
		g, ok := got.(json.Number)
		wf, err1 := w.Float64()
		gf, err2 := g.Float64()
		if !ok || err1 != nil || err2 != nil || wf != gf {
			*diffs = append(*diffs, fmt.Sprintf("%s: posted %s, read %s", path, w, synShort(got)))
		}
	case string:
		g, ok := got.(string)
		if ok && (g == w || synSameInstant(w, g)) {
			return
		}
		*diffs = append(*diffs, fmt.Sprintf("%s: posted %q, read %s", path, synTail(w, 80), synShort(got)))
	default:
		if fmt.Sprint(want) != fmt.Sprint(got) {
			*diffs = append(*diffs, fmt.Sprintf("%s: posted %v, read %s", path, want, synShort(got)))
		}
	}
}

// synSameInstant: two dateTimes for one instant in one offset ("+00:00" written as "Z").
func synSameInstant(a, b string) bool {
	ta, err1 := time.Parse(time.RFC3339Nano, a)
	tb, err2 := time.Parse(time.RFC3339Nano, b)
	if err1 != nil || err2 != nil || !ta.Equal(tb) {
		return false
	}
	_, oa := ta.Zone()
	_, ob := tb.Zone()
	return oa == ob
}

// synGeneric is a path without its indexes, to count additions by element.
func synGeneric(path string) string {
	var b strings.Builder
	skip := false
	for _, r := range path {
		switch {
		case r == '[':
			skip = true
		case r == ']':
			skip = false
		case !skip:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func synShort(v any) string {
	b, _ := json.Marshal(v)
	return synTail(string(b), 120)
}
