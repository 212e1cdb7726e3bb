package attacktest

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"carehub/e2e/servertest"
	"carehub/internal/testenv/rawhttp"
	"carehub/kernel/access"
	"carehub/processors/webhooks"
	"carehub/storage/demo"
)

// rcvExcerptLimit is the most of a receiver's answer an attempt keeps, in bytes: "the first KiB
// of the answer" (docs/WEBHOOKS.md). An attempt's error is held to the same bound: it names why
// the attempt failed, it is not a second copy of the answer.
const rcvExcerptLimit = 1 << 10

// rcvPatience bounds how long the test waits for what a healthy node does in a second or two
// (the slowest hostile attempt ends at the 15 s attempt timeout).
const rcvPatience = 90 * time.Second

// TestWebhookHostileReceivers: issue 55 sends a healthy concurrent subscription's first attempts
// from the consumer that reads the events and records each delivery, with its attempt, in one
// binary COPY per poll. A receiver answers what it likes: NUL bytes and invalid UTF-8 in a body
// (a text column), a body of megabytes or one that never ends, a malformed status line, bytes
// that are not HTTP, a huge header. None of that may refuse the COPY (the poll's other
// subscriptions and tenants would wait behind it), stall the consumer, or lose a delivery; every
// attempt must be recorded and readable, over REST and GraphQL alike, with the status as sent,
// an excerpt of at most 1 KiB of valid UTF-8 without NUL, and an error that is short and
// printable whatever the receiver sent. Two receivers failed it before their fix: invalid UTF-8
// over the whole KiB (cleanText replaced each invalid byte with three, an excerpt of 2,036 bytes)
// and a long header line (net/http quotes the line whole in its error, and the attempt kept that
// error as it was: 196,608 bytes for a line of 64 KiB, in every attempt). Headers are bounded
// at egress.MaxAnswerHeaderBytes, so attempts in flight at once cannot each hold megabytes.
func TestWebhookHostileReceivers(t *testing.T) {
	s := servertest.Start(t)
	admin := s.Key(demo.DemoOrgSlug, access.Live, access.AdminOrg, access.ExecWorkflows)
	project := s.ProjectID(demo.SepsisProjectName)
	_, otherProject, otherKey := otherTenant(t, s)

	receivers := rcvHostileReceivers(t)
	healthy, otherHealthy := newRcvHealthy(t), newRcvHealthy(t)
	healthy.hook = rcvCreate(t, s, admin, project, healthy.URL)
	otherHealthy.hook = rcvCreate(t, s, otherKey, otherProject, otherHealthy.URL)
	for _, rc := range receivers {
		rc.hook = rcvCreate(t, s, admin, project, rc.url)
	}

	// Two rounds: the first reaches every subscription on the consumer's path; by the second the
	// failed and slow subscriptions are left to the schedule (fastCooldown), so their deliveries
	// are sent and recorded by the lanes. Both stay under the ten failures that pause one.
	var published []string
	for round, n := range []int{5, 3} {
		ids := rcvPublish(t, s, admin, project, n, round)
		otherIDs := rcvPublish(t, s, otherKey, otherProject, n, round)
		healthy.waitFor(t, ids, 20*time.Second)
		otherHealthy.waitFor(t, otherIDs, 20*time.Second)
		published = append(published, ids...)
	}
	healthy.assertRecorded(t, s, admin)
	otherHealthy.assertRecorded(t, s, otherKey)

	for _, rc := range receivers {
		t.Run(rc.name, func(t *testing.T) {
			// A key of its own per receiver: the reads stay within one key's rate.
			key := s.Key(demo.DemoOrgSlug, access.Live, access.AdminOrg)
			rest := rcvWaitAttempted(t, s, key, rc.hook.ID, published)
			gql := rcvGraphQLDeliveries(t, s, key, rc.hook.ID)
			var found rcvFindings
			for _, d := range rest {
				if len(d.Attempts) == 0 || len(d.Attempts) != d.AttemptCount {
					t.Errorf("delivery %s (event %s): attemptCount %d, %d attempts in its log", d.ID, d.EventID, d.AttemptCount, len(d.Attempts))
					continue
				}
				for i, a := range d.Attempts {
					found.add(fmt.Sprintf("delivery %s attempt %d", d.ID, i), rc.check(a))
				}
				if got, want := d.LastStatusCode, d.Attempts[len(d.Attempts)-1].StatusCode; !rcvSameInt(got, want) {
					t.Errorf("delivery %s: lastStatusCode %s, its last attempt's %s", d.ID, rcvInt(got), rcvInt(want))
				}
				g, ok := gql[d.ID]
				if !ok {
					t.Errorf("delivery %s is in the REST log, not in GraphQL webhookDeliveries", d.ID)
					continue
				}
				// Attempts made between the two reads (a retry) may extend GraphQL's list.
				if len(g.Attempts) < len(d.Attempts) {
					t.Errorf("delivery %s: GraphQL lists %d attempts, REST %d", d.ID, len(g.Attempts), len(d.Attempts))
					continue
				}
				for i, a := range d.Attempts {
					if ga := g.Attempts[i]; !ga.equal(a) {
						t.Errorf("delivery %s attempt %d: GraphQL %s, REST %s", d.ID, i, ga, a)
					}
				}
			}
			found.report(t)
		})
	}
}

// rcvFindings counts the attempts of a receiver that show each problem, with the first of them.
type rcvFindings struct {
	attempts int
	order    []string
	first    map[string]string
	count    map[string]int
}

func (f *rcvFindings) add(where string, problems []string) {
	f.attempts++
	if f.first == nil {
		f.first, f.count = map[string]string{}, map[string]int{}
	}
	for _, p := range problems {
		if f.count[p] == 0 {
			f.order = append(f.order, p)
			f.first[p] = where
		}
		f.count[p]++
	}
}

// report fails t once per problem, naming how many attempts show it and the first that does.
func (f *rcvFindings) report(t *testing.T) {
	t.Helper()
	for _, p := range f.order {
		t.Errorf("%d of %d attempts: %s (first: %s)", f.count[p], f.attempts, p, f.first[p])
	}
}

// TestWebhookUpgradeAnswerEndsAttempt: a receiver that answers a delivery "101 Switching
// Protocols" (with Upgrade and Connection: Upgrade) and then says nothing. The attempt must end,
// within the attempt timeout (15 s, "connection included", docs/LIMITS.md), and be recorded
// failed. net/http hands a protocol switch's connection to the caller, outside the request's
// context, so reading the answer's body blocked until the receiver closed it: the attempt never
// ended, its delivery stayed delivering, and it kept one of the dispatcher's 256 attempts in
// flight. One key's four subscriptions of maxInFlight 64 took all of them, and no tenant's
// webhook was delivered by that node again. The fix refuses every switch (egress.Guard).
func TestWebhookUpgradeAnswerEndsAttempt(t *testing.T) {
	s := servertest.Start(t)
	attacker := s.Key(demo.DemoOrgSlug, access.Live, access.AdminOrg, access.ExecWorkflows)
	project := s.ProjectID(demo.SepsisProjectName)
	_, otherProject, otherKey := otherTenant(t, s)
	url, answered := rawhttp.Serve(t, []byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: rcv\r\nConnection: Upgrade\r\n\r\n"), true)
	healthy := newRcvHealthy(t)
	healthy.hook = rcvCreate(t, s, otherKey, otherProject, healthy.URL)

	const subs, inFlight = 4, 64 // 256: the dispatcher's attempts in flight (DefaultMaxInFlight)
	hooks := make([]rcvHook, subs)
	for i := range hooks {
		r := s.Do(http.MethodPost, "/v1/webhooks", attacker, map[string]any{"projectId": project, "url": url,
			"events": []string{"attack.*"}, "maxInFlight": inFlight})
		r.JSON(t, &hooks[i])
		if r.Status != http.StatusCreated {
			t.Fatalf("create webhook: %d %s", r.Status, r.Body)
		}
	}
	events := rcvPublish(t, s, attacker, project, inFlight, 0)
	servertest.Eventually(t, rcvPatience, "every attempt answered 101", func() bool { return answered.Load() >= subs*inFlight })

	// Another tenant's delivery, published now, waits for a free attempt: one at the latest when
	// the first of the attacker's attempts times out.
	start := time.Now()
	theirs := rcvPublish(t, s, otherKey, otherProject, 1, 0)
	deadline := start.Add(3 * webhooks.DefaultTimeout)
	for !healthy.has(theirs[0]) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if !healthy.has(theirs[0]) {
		t.Errorf("another tenant's delivery not made within %v while one key's %d receivers hold their attempts with a 101 answer",
			time.Since(start).Round(time.Second), subs*inFlight)
	}
	// Each attempt ended by its timeout and recorded, failed (or retried).
	key := s.Key(demo.DemoOrgSlug, access.Live, access.AdminOrg)
	var stuck int
	for time.Now().Before(deadline.Add(webhooks.DefaultTimeout)) {
		stuck = 0
		for _, h := range hooks {
			for _, d := range rcvList(t, s, key, h.ID) {
				if d.AttemptCount == 0 {
					stuck++
				}
			}
		}
		if stuck == 0 {
			break
		}
		time.Sleep(time.Second)
	}
	if stuck > 0 {
		t.Errorf("%d of %d deliveries of %d events still without a finished attempt %v after their attempts began (attempt timeout %v)",
			stuck, subs*len(events), len(events), time.Since(start).Round(time.Second), webhooks.DefaultTimeout)
	}
}

// rcvCase is a hostile receiver and what its attempts must record.
type rcvCase struct {
	name       string
	url        string
	status     int           // the status code answered; 0 when the answer is not HTTP
	marker     string        // how the recorded excerpt starts (what the receiver sent first)
	errHas     string        // what the error of an attempt without a status names
	minLatency time.Duration // how long an attempt lasts at least
	hook       rcvHook
}

// rcvHostileReceivers starts the hostile receivers, each on loopback.
func rcvHostileReceivers(t *testing.T) []*rcvCase {
	mib := 1 << 20
	// A body that never ends: the status and a first chunk at once, then NUL, invalid UTF-8 and
	// a dot every 100 ms until the client gives up (the 15 s attempt timeout).
	drip := func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "rcv-drip:")
		w.(http.Flusher).Flush()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				if _, err := io.WriteString(w, "\x00\xff."); err != nil {
					return
				}
				w.(http.Flusher).Flush()
			case <-r.Context().Done():
				return
			case <-t.Context().Done():
				return
			}
		}
	}
	hugeHeader := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Hostile", strings.Repeat("h", mib))
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "rcv-huge-header:ok")
	}
	cases := []*rcvCase{
		{name: "2xx body with NUL", status: 200, marker: "rcv-nul-200:",
			url: rcvAnswer(t, 200, "rcv-nul-200:\x00a\x00b\x00\x00c")},
		{name: "5xx body with NUL and invalid UTF-8", status: 500, marker: "rcv-nul-500:",
			url: rcvAnswer(t, 500, "rcv-nul-500:\x00\xff\xfe\xc3(\x00tail")},
		{name: "4xx body of invalid UTF-8", status: 400, marker: "rcv-utf8-400:",
			url: rcvAnswer(t, 400, "rcv-utf8-400:\xc3(\xa0\xa1\xe2\x28\xa1\xf0\x28\x8c\xbc\xed\xa0\x80end")},
		// Every other byte invalid, over the whole first KiB: replacing each invalid byte with
		// U+FFFD (three bytes) must not make the excerpt larger than the KiB kept.
		{name: "4xx invalid UTF-8 over the whole KiB", status: 422, marker: "rcv-utf8-kib:",
			url: rcvAnswer(t, 422, "rcv-utf8-kib:"+strings.Repeat("\xffa", 2*rcvExcerptLimit))},
		{name: "2xx body of 2 MiB", status: 200, marker: "rcv-big-200:",
			url: rcvAnswer(t, 200, "rcv-big-200:"+strings.Repeat("x\x00", mib))},
		{name: "5xx body over 1 MiB", status: 503, marker: "rcv-big-503:",
			url: rcvAnswer(t, 503, "rcv-big-503:"+strings.Repeat("\xfe", mib+1))},
		{name: "2xx body that never ends", status: 200, marker: "rcv-drip:", minLatency: time.Second,
			url: rcvServe(t, drip)},
		{name: "2xx with a 1 MiB header", errHas: "headers exceeded",
			url: rcvServe(t, hugeHeader)},
		{name: "malformed status line", errHas: "malformed HTTP status code",
			url: rcvRaw(t, []byte("HTTP/1.1 2x0 \x00\xffOK\r\nContent-Length: 0\r\n\r\n"))},
		{name: "not HTTP at all", errHas: "malformed HTTP",
			url: rcvRaw(t, []byte("\x00\xff\xfe\x16\x03\x01 SSH-2.0-rcv\x00\x1b[31m\r\n\r\n"))},
		// A header line of 48 KiB (under the limit on headers) without a colon, NUL and invalid
		// UTF-8 in it.
		{name: "header line of 48 KiB without a colon", errHas: "malformed",
			url: rcvRaw(t, []byte("HTTP/1.1 200 OK\r\nX"+strings.Repeat("\x00\xffA", 48<<10/3)+"\r\n\r\n"))},
		// Far over the client's limit on answer headers, and over net/http's own 10 MiB.
		{name: "headers over 10 MiB", errHas: "headers exceeded",
			url: rcvRaw(t, []byte("HTTP/1.1 200 OK\r\nX-Hostile: "+strings.Repeat("h", 11*mib)+"\r\n\r\n"))},
	}
	return cases
}

// check returns how attempt a differs from what rc answered.
func (rc *rcvCase) check(a rcvAttempt) []string {
	var p []string
	if rc.status == 0 {
		if a.StatusCode != nil || a.ResponseBody != nil {
			p = append(p, fmt.Sprintf("status %s, body %.80q recorded: the receiver sent no HTTP answer", rcvInt(a.StatusCode), rcvStr(a.ResponseBody)))
		}
	} else if a.StatusCode == nil || *a.StatusCode != rc.status {
		p = append(p, fmt.Sprintf("status %s recorded, the receiver answered %d", rcvInt(a.StatusCode), rc.status))
	}
	if rc.status != 0 {
		switch b := rcvStr(a.ResponseBody); {
		case a.ResponseBody == nil:
			p = append(p, fmt.Sprintf("no response body recorded, the receiver answered %q…", rc.marker))
		case !utf8.ValidString(b) || strings.ContainsRune(b, 0):
			p = append(p, fmt.Sprintf("response body %.80q is not valid UTF-8 without NUL", b))
		case len(b) > rcvExcerptLimit:
			p = append(p, fmt.Sprintf("response body excerpt of %d bytes, over the %d kept (%.40q…)", len(b), rcvExcerptLimit, b))
		case !strings.HasPrefix(b, rc.marker):
			p = append(p, fmt.Sprintf("response body %.80q does not start with what the receiver sent, %q", b, rc.marker))
		}
	}
	ok := rc.status >= 200 && rc.status < 300
	switch e := rcvStr(a.Error); {
	case ok && a.Error != nil:
		p = append(p, fmt.Sprintf("error %.80q on a %d answer", e, rc.status))
	case ok:
	case a.Error == nil || e == "":
		p = append(p, "no error recorded for a failed attempt")
	case len(e) > rcvExcerptLimit:
		p = append(p, fmt.Sprintf("error of %d bytes, over %d: it copies what the receiver sent (%.60q…)", len(e), rcvExcerptLimit, e))
	case !rcvPrintable(e):
		p = append(p, fmt.Sprintf("error %q carries unescaped bytes of the receiver's", e))
	case rc.status != 0 && !strings.Contains(e, strconv.Itoa(rc.status)):
		p = append(p, fmt.Sprintf("error %q does not name the status %d", e, rc.status))
	case rc.status == 0 && !strings.Contains(e, rc.errHas):
		p = append(p, fmt.Sprintf("error %q does not name %q", e, rc.errHas))
	}
	if a.LatencyMs < 0 || time.Duration(a.LatencyMs)*time.Millisecond < rc.minLatency {
		p = append(p, fmt.Sprintf("latency %d ms, the receiver took %v at least", a.LatencyMs, rc.minLatency))
	}
	return p
}

// rcvPrintable reports whether s is valid UTF-8 made of printable characters and spaces only.
func rcvPrintable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) && r != ' ' {
			return false
		}
	}
	return true
}

// rcvAnswer starts a receiver that reads each delivery and answers status with body.
func rcvAnswer(t *testing.T, status int, body string) string {
	return rcvServe(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	})
}

// rcvServe starts a receiver on loopback that reads each delivery's body and calls h.
func rcvServe(t *testing.T, h http.HandlerFunc) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, 1<<20))
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// rcvRaw starts a TCP receiver on loopback that answers each request with the bytes answer,
// HTTP or not.
func rcvRaw(t *testing.T, answer []byte) string {
	url, _ := rawhttp.Serve(t, answer, false)
	return url
}

// rcvHook is a subscription as created.
type rcvHook struct{ ID, Secret string }

// rcvCreate subscribes url to the test's events of project, with the defaults (concurrent, 16 in
// flight, no rate limit: the consumer sends its first attempts).
func rcvCreate(t *testing.T, s *servertest.Server, key, project, url string) rcvHook {
	t.Helper()
	r := s.Do(http.MethodPost, "/v1/webhooks", key, map[string]any{"projectId": project, "url": url, "events": []string{"attack.*"}})
	var hook rcvHook
	r.JSON(t, &hook)
	if r.Status != http.StatusCreated || hook.ID == "" {
		t.Fatalf("create webhook for %s: %d %s", url, r.Status, r.Body)
	}
	return hook
}

// rcvPublish publishes n events to project in one request and returns their ids.
func rcvPublish(t *testing.T, s *servertest.Server, key, project string, n, round int) []string {
	t.Helper()
	evs := make([]map[string]any, n)
	for i := range evs {
		evs[i] = map[string]any{"projectId": project, "type": "attack.receiver_probe", "payload": map[string]any{"round": round, "i": i}}
	}
	r := s.Do(http.MethodPost, "/v1/events", key, evs)
	var out struct{ Data []struct{ ID string } }
	r.JSON(t, &out)
	if r.Status != http.StatusAccepted || len(out.Data) != n {
		t.Fatalf("publish %d events: %d %s", n, r.Status, r.Body)
	}
	ids := make([]string, n)
	for i, d := range out.Data {
		ids[i] = d.ID
	}
	return ids
}

// rcvHealthy is a receiver that answers 204 at once and keeps each delivery's webhook-id, once
// its signature verifies.
type rcvHealthy struct {
	*httptest.Server
	hook rcvHook
	mu   sync.Mutex
	got  map[string]bool
	bad  []string
}

func newRcvHealthy(t *testing.T) *rcvHealthy {
	rc := &rcvHealthy{got: map[string]bool{}}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if !verifyDelivery(rc.hook.Secret, hookRequest{header: r.Header, body: body}) {
			rc.bad = append(rc.bad, r.Header.Get("webhook-id"))
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		rc.got[r.Header.Get("webhook-id")] = true
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.Close)
	return rc
}

// has reports whether the event id reached the receiver.
func (rc *rcvHealthy) has(id string) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.got[id]
}

// waitFor fails t unless every event of ids reaches the receiver, signed, within d.
func (rc *rcvHealthy) waitFor(t *testing.T, ids []string, d time.Duration) {
	t.Helper()
	missing := func() []string {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		var m []string
		for _, id := range ids {
			if !rc.got[id] {
				m = append(m, id)
			}
		}
		return m
	}
	deadline := time.Now().Add(d)
	for len(missing()) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	rc.mu.Lock()
	bad := rc.bad
	rc.mu.Unlock()
	if m := missing(); len(m) > 0 || len(bad) > 0 {
		t.Fatalf("the healthy receiver beside the hostile ones: %d of %d events not delivered within %v (%v); %d badly signed (%v)",
			len(m), len(ids), d, m, len(bad), bad)
	}
}

// assertRecorded fails t unless the receiver's deliveries are each recorded succeeded, with one
// attempt, the 204 it answered.
func (rc *rcvHealthy) assertRecorded(t *testing.T, s *servertest.Server, key string) {
	t.Helper()
	rc.mu.Lock()
	want := len(rc.got)
	rc.mu.Unlock()
	var list []rcvDelivery
	servertest.Eventually(t, rcvPatience, "the healthy receiver's deliveries recorded succeeded", func() bool {
		list = rcvList(t, s, key, rc.hook.ID)
		done := 0
		for _, d := range list {
			if d.Status == "succeeded" {
				done++
			}
		}
		return len(list) == want && done == want
	})
	for _, d := range list {
		if d.AttemptCount != 1 || d.LastStatusCode == nil || *d.LastStatusCode != http.StatusNoContent {
			t.Errorf("healthy delivery %s: %d attempts, last status %s; want one, 204", d.ID, d.AttemptCount, rcvInt(d.LastStatusCode))
		}
	}
}

// rcvDelivery is a delivery as GET /v1/webhooks/deliveries/{id} and webhookDeliveries give it.
type rcvDelivery struct {
	ID             string       `json:"id"`
	EventID        string       `json:"eventId"`
	Status         string       `json:"status"`
	AttemptCount   int          `json:"attemptCount"`
	LastStatusCode *int         `json:"lastStatusCode"`
	Attempts       []rcvAttempt `json:"attempts"`
}

// rcvAttempt is one attempt of a delivery's log, comparable between REST and GraphQL.
type rcvAttempt struct {
	StatusCode   *int    `json:"statusCode"`
	LatencyMs    int     `json:"latencyMs"`
	Error        *string `json:"error"`
	ResponseBody *string `json:"responseBody"`
}

func (a rcvAttempt) String() string {
	return fmt.Sprintf("{status %s, %d ms, error %.80q, body %.80q}", rcvInt(a.StatusCode), a.LatencyMs, rcvStr(a.Error), rcvStr(a.ResponseBody))
}

// The pointers differ between two decodings; compare what they point at.
func (a rcvAttempt) equal(b rcvAttempt) bool {
	return rcvSameInt(a.StatusCode, b.StatusCode) && a.LatencyMs == b.LatencyMs &&
		(a.Error == nil) == (b.Error == nil) && rcvStr(a.Error) == rcvStr(b.Error) &&
		(a.ResponseBody == nil) == (b.ResponseBody == nil) && rcvStr(a.ResponseBody) == rcvStr(b.ResponseBody)
}

// rcvList lists a subscription's deliveries over REST (one page: the test makes fewer than 100).
func rcvList(t *testing.T, s *servertest.Server, key, hook string) []rcvDelivery {
	t.Helper()
	r := s.Do(http.MethodGet, "/v1/webhooks/"+hook+"/deliveries?limit=100", key, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET deliveries of %s: %d %s", hook, r.Status, r.Body)
	}
	var out struct{ Data []rcvDelivery }
	r.JSON(t, &out)
	return out.Data
}

// rcvWaitAttempted waits until the subscription has a delivery of each event of events, each
// with its first attempt finished, and returns them with their attempt logs, read over REST.
func rcvWaitAttempted(t *testing.T, s *servertest.Server, key, hook string, events []string) []rcvDelivery {
	t.Helper()
	var list []rcvDelivery
	servertest.Eventually(t, rcvPatience, "a delivery of every event, each attempted", func() bool {
		list = rcvList(t, s, key, hook)
		byEvent := map[string]bool{}
		for _, d := range list {
			if d.AttemptCount > 0 {
				byEvent[d.EventID] = true
			}
		}
		for _, ev := range events {
			if !byEvent[ev] {
				return false
			}
		}
		return true
	})
	if len(list) != len(events) {
		t.Errorf("%d deliveries recorded for %d events", len(list), len(events))
	}
	for i, d := range list {
		r := s.Do(http.MethodGet, "/v1/webhooks/deliveries/"+d.ID, key, nil)
		if r.Status != http.StatusOK || !utf8.Valid(r.Body) || bytes.IndexByte(r.Body, 0) >= 0 {
			t.Fatalf("GET delivery %s: %d %.300q", d.ID, r.Status, r.Body)
		}
		r.JSON(t, &list[i])
	}
	return list
}

// rcvGraphQLDeliveries reads the subscription's deliveries with their attempts over GraphQL.
func rcvGraphQLDeliveries(t *testing.T, s *servertest.Server, key, hook string) map[string]rcvDelivery {
	t.Helper()
	const q = `query($id: ID!) { webhookDeliveries(webhookId: $id, limit: 100) {
		id eventId status attemptCount attempts { statusCode latencyMs error responseBody } } }`
	var data struct{ WebhookDeliveries []rcvDelivery }
	s.MustGraphQL(t, key, q, map[string]any{"id": hook}, &data)
	out := map[string]rcvDelivery{}
	for _, d := range data.WebhookDeliveries {
		out[d.ID] = d
	}
	return out
}

func rcvSameInt(a, b *int) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func rcvInt(p *int) string {
	if p == nil {
		return "null"
	}
	return strconv.Itoa(*p)
}

func rcvStr(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
