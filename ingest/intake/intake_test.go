package intake_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"carehub/ingest/intake"
	"carehub/internal/testenv"
	"carehub/kernel/access"
	"carehub/kernel/fault"
	obs "carehub/processors/observations"
	"carehub/schemas/kafka/observation"
	"carehub/storage/kafka/kafkatest"
)

func TestSingleObservationStoredWithItsEvent(t *testing.T) {
	w := newWorld(t)
	in := newIntake(t, w)
	startWriter(t, w)
	o := vital(w.synthA, func(o map[string]any) {
		o["effectiveDateTime"] = "2026-10-31T22:15:00.5+01:00"
		o["identifier"] = []any{map[string]any{"system": "urn:device", "value": "d-1"}}
	})
	for _, ct := range []string{intake.MediaFHIRJSON, intake.MediaJSON + "; charset=utf-8"} {
		res, err := submit(t, in, principal(w.orgA, access.Live), ct, mustJSON(t, o))
		if err != nil {
			t.Fatalf("%s: %v", ct, err)
		}
		if res.Answer.Accepted != 1 || len(res.Answer.IDs) != 1 || len(res.Answer.Rejected) != 0 || res.Replayed {
			t.Fatalf("%s: answer %+v", ct, res)
		}
		id := res.Answer.IDs[0]
		waitStored(t, w, []string{id})

		var org, patient, status, loinc, unit, device, resID, subject string
		var value float64
		var effective, received time.Time
		err = w.pool.QueryRow(context.Background(), `select org_id, patient_id, status, loinc, value, unit, device_type,
	effective_at, received_at, resource->>'id', resource->'subject'->>'reference' from observations where id = $1`, id).
			Scan(&org, &patient, &status, &loinc, &value, &unit, &device, &effective, &received, &resID, &subject)
		if err != nil {
			t.Fatal(err)
		}
		if org != w.orgA || patient != w.synthA || status != "final" || loinc != "8867-4" || value != 72 || unit != "/min" ||
			device != "wearable" || resID != id || subject != "Patient/"+w.synthA ||
			!effective.Equal(time.Date(2026, 10, 31, 21, 15, 0, 5e8, time.UTC)) || time.Since(received) > time.Minute {
			t.Fatalf("stored %s %s %s %s %v %s %s %s %s %v %v", org, patient, status, loinc, value, unit, device, resID, subject, effective, received)
		}

		evs := waitEvents(t, w, []string{id})[observation.EventID(id)]
		if len(evs) != 1 {
			t.Fatalf("%d events of %s", len(evs), id)
		}
		if ev := evs[0]; ev.Type != "device.observation_received" || ev.OrgID != w.orgA || ev.ProjectID != w.projectA {
			t.Fatalf("event %s of %s in %s; want the organization's oldest project %s", ev.Type, ev.OrgID, ev.ProjectID, w.projectA)
		}
		var payload map[string]any
		if err := json.Unmarshal(evs[0].Payload, &payload); err != nil {
			t.Fatal(err)
		}
		want := map[string]any{"observationId": id, "patientId": w.synthA, "code": "8867-4", "deviceType": "wearable",
			"value": 72.0, "unit": "/min", "effectiveAt": "2026-10-31T21:15:00.5Z"}
		if fmt.Sprint(payload) != fmt.Sprint(want) {
			t.Fatalf("payload %v; want %v", payload, want)
		}
	}
}

func TestBatchAnswersEachEntry(t *testing.T) {
	w := newWorld(t)
	in := newIntake(t, w)
	startWriter(t, w)
	entries := []map[string]any{
		vital(w.synthA),
		vital(w.synthA, func(o map[string]any) { o["status"] = "done" }),
		vital(w.realA),
		vital(w.synthA, func(o map[string]any) { delete(o, "code") }),
		vital("pat_01kf3fm8c0xbzcfajp6n9d2emj"), // does not exist
		vital(w.synthB),                         // another tenant's
		vital(w.synthA, func(o map[string]any) { o["valueQuantity"] = map[string]any{"value": 500, "unit": "/min"} }),
		vital(w.synthA, func(o map[string]any) { o["effectiveDateTime"] = time.Now().Add(48 * time.Hour).Format(time.RFC3339) }),
		vital(w.synthA, func(o map[string]any) { o["resourceType"] = "Patient" }),
		vital(w.synthA, func(o map[string]any) { o["subject"] = map[string]any{"reference": "Group/x"} }),
	}
	body := bundle(t, "batch", entries...)
	// An entry without a resource, and one that is not a POST of an Observation.
	var b map[string]any
	_ = json.Unmarshal(body, &b)
	b["entry"] = append(b["entry"].([]any), map[string]any{"fullUrl": "urn:uuid:1"},
		map[string]any{"resource": vital(w.synthA), "request": map[string]any{"method": "DELETE", "url": "Observation/1"}})
	res, err := submit(t, in, principal(w.orgA, access.Live), intake.MediaFHIRJSON, mustJSON(t, b))
	if err != nil {
		t.Fatal(err)
	}
	want := "1:INVALID_STATUS,3:MISSING_CODE,4:UNKNOWN_PATIENT,5:UNKNOWN_PATIENT,6:INVALID_VALUE,7:INVALID_EFFECTIVE,8:INVALID_RESOURCE,9:INVALID_SUBJECT,10:INVALID_ENTRY,11:INVALID_ENTRY"
	if got := codesOf(res.Answer.Rejected); got != want || res.Answer.Accepted != 2 || len(res.Answer.IDs) != 2 {
		t.Fatalf("accepted %d %v, rejected %s; want 2 accepted, rejected %s", res.Answer.Accepted, res.Answer.IDs, got, want)
	}
	// The unknown and the other tenant's patient are indistinguishable.
	if res.Answer.Rejected[2].Message == "" || strings.Replace(res.Answer.Rejected[2].Message, "pat_01kf3fm8c0xbzcfajp6n9d2emj", w.synthB, 1) != res.Answer.Rejected[3].Message {
		t.Fatalf("messages differ: %q / %q", res.Answer.Rejected[2].Message, res.Answer.Rejected[3].Message)
	}
	waitStored(t, w, res.Answer.IDs)
	if n := count(t, w.pool, `select count(*) from observations`); n != 2 {
		t.Fatalf("%d stored; want 2", n)
	}
}

// endOffsets sums the topic's high watermarks: records produced, committed or not.
func endOffsets(t *testing.T, w *world) int64 {
	t.Helper()
	cl := kafkatest.Client(t)
	ends, err := kadm.NewClient(cl).ListEndOffsets(context.Background(), w.topic)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

func TestTransactionBundleIsAllOrNothing(t *testing.T) {
	w := newWorld(t)
	in := newIntake(t, w)
	ctx := principal(w.orgA, access.Live)
	bad := bundle(t, "transaction", vital(w.synthA), vital(w.synthA), vital(w.synthB), vital(w.synthA, func(o map[string]any) { o["status"] = "x" }))
	_, err := submit(t, in, ctx, intake.MediaFHIRJSON, bad)
	f := fault.As(err)
	if f == nil || f.Kind != fault.KindValidation || f.Details["accepted"] != 0 || codesOf(f.Details["rejected"].([]intake.EntryError)) != "2:UNKNOWN_PATIENT,3:INVALID_STATUS" {
		t.Fatalf("invalid transaction: %v %+v", err, f)
	}
	if n := endOffsets(t, w); n != 0 {
		t.Fatalf("a rejected transaction produced %d records", n)
	}
	res, err := submit(t, in, ctx, intake.MediaFHIRJSON, bundle(t, "transaction", vital(w.synthA), vital(w.realA)))
	if err != nil || res.Answer.Accepted != 2 {
		t.Fatalf("valid transaction: %+v %v", res, err)
	}
	startWriter(t, w)
	waitStored(t, w, res.Answer.IDs)
}

func TestWholeRequestErrors(t *testing.T) {
	w := newWorld(t)
	in := newIntake(t, w, func(c *intake.Config) { c.MaxEntries = 5; c.MaxBodyBytes = 8 << 10 })
	ctx := principal(w.orgA, access.Live)
	six := make([]map[string]any, 6)
	for i := range six {
		six[i] = vital(w.synthA)
	}
	tests := []struct {
		name        string
		ctx         context.Context
		contentType string
		body        []byte
		kind        fault.Kind
	}{
		{"no credential", context.Background(), intake.MediaFHIRJSON, mustJSON(t, vital(w.synthA)), fault.KindUnauthenticated},
		{"no write:observations", principal(w.orgA, access.Live, access.ReadObservations), intake.MediaFHIRJSON, mustJSON(t, vital(w.synthA)), fault.KindInsufficientScope},
		{"text/plain", ctx, "text/plain", mustJSON(t, vital(w.synthA)), fault.KindUnsupportedMedia},
		{"no content type", ctx, "", mustJSON(t, vital(w.synthA)), fault.KindUnsupportedMedia},
		{"XML", ctx, "application/fhir+xml", []byte("<Observation/>"), fault.KindUnsupportedMedia},
		{"not JSON", ctx, intake.MediaFHIRJSON, []byte("{"), fault.KindInvalid},
		{"bundle entry not an array", ctx, intake.MediaFHIRJSON, []byte(`{"resourceType":"Bundle","type":"batch","entry":{}}`), fault.KindInvalid},
		{"searchset bundle", ctx, intake.MediaFHIRJSON, bundle(t, "searchset", vital(w.synthA)), fault.KindValidation},
		{"empty bundle", ctx, intake.MediaFHIRJSON, bundle(t, "batch"), fault.KindValidation},
		{"empty stream", ctx, intake.MediaFHIRNDJSON, []byte("\n\n"), fault.KindValidation},
		{"a Patient", ctx, intake.MediaFHIRJSON, []byte(`{"resourceType":"Patient"}`), fault.KindValidation},
		{"invalid single", ctx, intake.MediaFHIRJSON, mustJSON(t, vital(w.synthA, func(o map[string]any) { delete(o, "status") })), fault.KindValidation},
		{"bundle over the entry limit", ctx, intake.MediaFHIRJSON, bundle(t, "batch", six...), fault.KindTooLarge},
		{"stream over the entry limit", ctx, intake.MediaFHIRNDJSON, ndjson(t, six...), fault.KindTooLarge},
		{"body over the byte limit", ctx, intake.MediaFHIRJSON, mustJSON(t, vital(w.synthA, func(o map[string]any) { o["note"] = strings.Repeat("x", 9<<10) })), fault.KindTooLarge},
		{"stream over the byte limit", ctx, intake.MediaFHIRNDJSON, []byte(strings.Repeat(" \n", 5<<10)), fault.KindTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := submit(t, in, tt.ctx, tt.contentType, tt.body)
			if fault.KindOf(err) != tt.kind {
				t.Fatalf("error %v (kind %d); want kind %d", err, fault.KindOf(err), tt.kind)
			}
			if f := fault.As(err); f == nil || f.Message == "" || res.Answer.Accepted != 0 {
				t.Fatalf("answer %+v, error %v", res, err)
			}
		})
	}
	if n := endOffsets(t, w); n != 0 {
		t.Fatalf("refused requests produced %d records", n)
	}
}

func TestNDJSONStreamAnswersEachLine(t *testing.T) {
	w := newWorld(t)
	in := newIntake(t, w)
	startWriter(t, w)
	lines := []string{
		string(mustJSON(t, vital(w.synthA))),
		"",
		`{"resourceType":"Observation","status":`, // malformed
		string(mustJSON(t, vital(w.synthA, func(o map[string]any) { o["valueQuantity"] = map[string]any{"value": "high", "unit": "/min"} }))),
		"   ",
		`{"resourceType":"Observation","note":"` + strings.Repeat("x", intake.MaxEntryBytes) + `"}`, // longer than a line may be
		string(mustJSON(t, vital(w.realA))) + "\r",                                                  // CRLF
		string(mustJSON(t, vital(w.synthB))),
		string(mustJSON(t, vital(w.synthA))), // no trailing newline
	}
	res, err := submit(t, in, principal(w.orgA, access.Live), intake.MediaFHIRNDJSON+"; charset=utf-8", []byte(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	want := "2:INVALID_JSON,3:INVALID_VALUE,5:ENTRY_TOO_LARGE,7:UNKNOWN_PATIENT"
	if got := codesOf(res.Answer.Rejected); got != want || res.Answer.Accepted != 3 {
		t.Fatalf("accepted %d, rejected %s; want 3 and %s", res.Answer.Accepted, got, want)
	}
	waitStored(t, w, res.Answer.IDs)
}

// TestNDJSONIsProducedWhileRead holds a stream open after its first chunks and watches their
// records arrive at the broker (uncommitted, so no writer can see them yet) before the stream
// ends: the body is produced as it is read, never buffered whole.
func TestNDJSONIsProducedWhileRead(t *testing.T) {
	w := newWorld(t)
	in := newIntake(t, w)
	pr, pw := io.Pipe()
	type outcome struct {
		res intake.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := in.Submit(principal(w.orgA, access.Live), intake.Submission{ContentType: intake.MediaFHIRNDJSON, Body: pr})
		done <- outcome{res, err}
	}()
	list := make([]map[string]any, 1200)
	for i := range list {
		list[i] = vital(w.synthA)
	}
	if _, err := pw.Write(ndjson(t, list...)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for endOffsets(t, w) < 1000 {
		if time.Now().After(deadline) {
			t.Fatalf("%d records produced while the stream is open; want the first two chunks", endOffsets(t, w))
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case o := <-done:
		t.Fatalf("answered before the stream ended: %+v %v", o.res, o.err)
	default:
	}
	pw.Close()
	o := <-done
	if o.err != nil || o.res.Answer.Accepted != 1200 {
		t.Fatalf("%+v %v", o.res.Answer.Accepted, o.err)
	}
	startWriter(t, w)
	waitStored(t, w, o.res.Answer.IDs)
}

// TestRefusedStreamIsNeverStored sends an NDJSON stream that passes the entry limit after its
// first chunks were produced: the answer is 413 and none of it is stored, although its records
// reached the broker (their transaction aborted).
func TestRefusedStreamIsNeverStored(t *testing.T) {
	w := newWorld(t)
	in := newIntake(t, w, func(c *intake.Config) { c.MaxEntries = 1100 })
	startWriter(t, w)
	ctx := principal(w.orgA, access.Live)
	list := make([]map[string]any, 1101)
	var refused []string
	for i := range list {
		clientID := fmt.Sprintf("refused-%d", i)
		list[i] = vital(w.synthA, func(o map[string]any) { o["id"] = clientID })
		refused = append(refused, intake.ClientObservationID(w.orgA, clientID, mustJSON(t, list[i])))
	}
	streamOverLimit(t, w, in, list)
	// A later request is stored; by then the writer has read past the aborted records.
	res, err := submit(t, in, ctx, intake.MediaFHIRJSON, mustJSON(t, vital(w.synthA)))
	if err != nil {
		t.Fatal(err)
	}
	waitStored(t, w, res.Answer.IDs)
	if n := count(t, w.pool, `select count(*) from observations where id = any($1)`, refused); n != 0 {
		t.Fatalf("%d observations of the refused request were stored", n)
	}
}

func TestTenancyAndTestMode(t *testing.T) {
	w := newWorld(t)
	in := newIntake(t, w)
	tests := []struct {
		name     string
		ctx      context.Context
		patient  string
		accepted bool
	}{
		{"live key, real patient", principal(w.orgA, access.Live), w.realA, true},
		{"live key, synthetic patient", principal(w.orgA, access.Live), w.synthA, true},
		{"test key, synthetic patient", principal(w.orgA, access.Test), w.synthA, true},
		{"test key, real patient", principal(w.orgA, access.Test), w.realA, false},
		{"another organization's patient", principal(w.orgB, access.Live), w.synthA, false},
		{"platform operator", access.With(context.Background(), &access.Principal{Platform: true, Mode: access.Live}), w.synthB, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := submit(t, in, tt.ctx, intake.MediaFHIRJSON, bundle(t, "batch", vital(tt.patient)))
			if tt.accepted {
				if err != nil || res.Answer.Accepted != 1 {
					t.Fatalf("%+v %v", res, err)
				}
				return
			}
			f := fault.As(err)
			if f == nil || f.Kind != fault.KindValidation {
				t.Fatalf("err %v; want 422", err)
			}
			rej := f.Details["rejected"].([]intake.EntryError)
			if len(rej) != 1 || rej[0].Code != intake.CodeUnknownPatient || rej[0].Message != fmt.Sprintf("patient %q not found", tt.patient) {
				t.Fatalf("rejected %+v", rej)
			}
		})
	}
}

func TestSameClientIDIsStoredOnce(t *testing.T) {
	w := newWorld(t)
	in := newIntake(t, w)
	startWriter(t, w)
	ctx := principal(w.orgA, access.Live)
	o := vital(w.synthA, func(o map[string]any) { o["id"] = "monitor-3.reading-981" })
	var ids []string
	for _, body := range [][]byte{mustJSON(t, o), ndjson(t, o, o), bundle(t, "batch", o)} {
		ct := intake.MediaFHIRJSON
		if body[len(body)-1] == '\n' {
			ct = intake.MediaFHIRNDJSON
		}
		res, err := submit(t, in, ctx, ct, body)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Answer.IDs...)
	}
	if len(distinct(ids)) != 1 || ids[0] != intake.ClientObservationID(w.orgA, "monitor-3.reading-981", mustJSON(t, o)) {
		t.Fatalf("ids %v; want one id derived from the client id and the observation", ids)
	}
	// The same client id in another organization is another observation.
	other, err := submit(t, in, principal(w.orgB, access.Live), intake.MediaFHIRJSON, mustJSON(t, vital(w.synthB, func(o map[string]any) { o["id"] = "monitor-3.reading-981" })))
	if err != nil || other.Answer.IDs[0] == ids[0] {
		t.Fatalf("other organization: %+v %v", other, err)
	}
	// Another observation under an id already used is stored too, not acknowledged and dropped.
	changed, err := submit(t, in, ctx, intake.MediaFHIRJSON, mustJSON(t, vital(w.synthA, func(o map[string]any) {
		o["id"] = "monitor-3.reading-981"
		o["valueQuantity"] = map[string]any{"value": 95, "unit": "/min", "system": "http://unitsofmeasure.org", "code": "/min"}
	})))
	if err != nil || changed.Answer.IDs[0] == ids[0] {
		t.Fatalf("another observation under the same client id: %+v %v", changed, err)
	}
	waitStored(t, w, append(append(ids, other.Answer.IDs...), changed.Answer.IDs...))
	// Let the writer read everything (a later request is stored after the duplicates).
	last, err := submit(t, in, ctx, intake.MediaFHIRJSON, mustJSON(t, vital(w.synthA)))
	if err != nil {
		t.Fatal(err)
	}
	waitStored(t, w, last.Answer.IDs)
	if n := count(t, w.pool, `select count(*) from observations where id = $1`, ids[0]); n != 1 {
		t.Fatalf("stored %d times", n)
	}
	// Each copy on the topic has its event record, all under one id: consumers keep one.
	if n := len(waitEvents(t, w, ids[:1])[observation.EventID(ids[0])]); n < 1 || n > len(ids) {
		t.Fatalf("%d event records for %d copies", n, len(ids))
	}
	var clientID string
	if err := w.pool.QueryRow(context.Background(), `select i->>'value' from observations, json_array_elements(resource->'identifier') i
where id = $1 and i->>'system' = $2`, ids[0], obs.ClientIDSystem).Scan(&clientID); err != nil || clientID != "monitor-3.reading-981" {
		t.Fatalf("client id kept as %q: %v", clientID, err)
	}
}

func TestIdempotencyKey(t *testing.T) {
	w := newWorld(t)
	in := newIntake(t, w)
	ctx := principal(w.orgA, access.Live)
	send := func(ctx context.Context, key string, body []byte) (intake.Result, error) {
		return in.Submit(ctx, intake.Submission{ContentType: intake.MediaFHIRJSON, Body: strings.NewReader(string(body)), IdempotencyKey: key})
	}
	body := bundle(t, "batch", vital(w.synthA), vital(w.synthB))
	first, err := send(ctx, "k-1", body)
	if err != nil || first.Replayed || first.Answer.Accepted != 1 {
		t.Fatalf("first: %+v %v", first, err)
	}
	// Measured after the first answer, not assumed: a transaction the client aborted and
	// published again (a retry the intake makes) leaves its records and markers too. A broker
	// may write the first commit's marker after answering it, so one offset more is not a
	// replay's; a replay produced would add its record and its own marker.
	produced := endOffsets(t, w)
	again, err := send(ctx, "k-1", body)
	if err != nil || !again.Replayed || fmt.Sprint(again.Answer) != fmt.Sprint(first.Answer) {
		t.Fatalf("replay: %+v %v; want %+v", again, err, first)
	}
	if n := endOffsets(t, w); n > produced+1 {
		t.Fatalf("the replay produced again: %d offsets after it, %d before", n, produced)
	}
	if _, err := send(ctx, "k-1", bundle(t, "batch", vital(w.synthA))); fault.KindOf(err) != fault.KindConflict {
		t.Fatalf("another body: %v; want 409", err)
	}
	// Keys are per organization.
	if res, err := send(principal(w.orgB, access.Live), "k-1", body); err != nil || res.Replayed {
		t.Fatalf("another organization: %+v %v", res, err)
	}
	// A 422 is an answer too, and replayed.
	invalid := mustJSON(t, vital(w.synthB))
	_, err1 := send(ctx, "k-2", invalid)
	res2, err2 := send(ctx, "k-2", invalid)
	if fault.KindOf(err1) != fault.KindValidation || fault.KindOf(err2) != fault.KindValidation || !res2.Replayed ||
		fmt.Sprint(fault.As(err1).Details) != fmt.Sprint(fault.As(err2).Details) || fault.As(err1).Message != fault.As(err2).Message {
		t.Fatalf("422 replay: %v / %v %+v", err1, err2, res2)
	}
	// A refused request (415) releases its key: the corrected retry runs.
	if _, err := in.Submit(ctx, intake.Submission{ContentType: "text/csv", Body: strings.NewReader("x"), IdempotencyKey: "k-3"}); fault.KindOf(err) != fault.KindUnsupportedMedia {
		t.Fatal(err)
	}
	if res, err := send(ctx, "k-3", body); err != nil || res.Replayed || res.Answer.Accepted != 1 {
		t.Fatalf("retry after 415: %+v %v", res, err)
	}
	// While a request with the key runs, the same key is 409.
	pr, pw := io.Pipe()
	running := make(chan error, 1)
	go func() {
		_, err := in.Submit(ctx, intake.Submission{ContentType: intake.MediaFHIRNDJSON, Body: pr, IdempotencyKey: "k-4"})
		running <- err
	}()
	pw.Write(ndjson(t, vital(w.synthA)))
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := send(ctx, "k-4", body)
		if fault.KindOf(err) == fault.KindConflict {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("concurrent use of a key: %v; want 409", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	pw.Close()
	if err := <-running; err != nil {
		t.Fatal(err)
	}
	if _, err := send(ctx, "", body); err != nil {
		t.Fatal(err)
	}
	if _, err := send(ctx, strings.Repeat("k", 256), body); fault.KindOf(err) != fault.KindInvalid {
		t.Fatalf("a 256-character key: %v", err)
	}
}

func TestDeadBrokerIsUnavailable(t *testing.T) {
	w := newWorld(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	in := newIntake(t, w, func(c *intake.Config) {
		c.Brokers = []string{dead}
		c.RequestTimeout = 2 * time.Second
	})
	start := time.Now()
	res, err := submit(t, in, principal(w.orgA, access.Live), intake.MediaFHIRJSON, bundle(t, "batch", vital(w.synthA), vital(w.realA)))
	if fault.KindOf(err) != fault.KindUnavailable || res.Answer.Accepted != 0 {
		t.Fatalf("%+v %v; want 503", res, err)
	}
	// The device is told which system is down and when to retry.
	if msg := fault.As(err).Message; !strings.HasPrefix(msg, "observation intake is unavailable: the Kafka broker cannot be reached") ||
		!strings.Contains(msg, "retry after 2 s") {
		t.Errorf("message %q", msg)
	}
	if time.Since(start) > 15*time.Second {
		t.Fatalf("answered after %v", time.Since(start))
	}
}

// TestBrokerLostMidStream stops the broker while a stream is being produced: the answer is 503,
// never a 202 for records the broker may not have.
func TestBrokerLostMidStream(t *testing.T) {
	if kafkatest.Real() {
		t.Skip("stops its broker: runs on its own kfake cluster only")
	}
	w := newWorld(t)
	cluster, err := kfakeCluster(t, w.topic)
	if err != nil {
		t.Fatal(err)
	}
	in := newIntake(t, w, func(c *intake.Config) {
		c.Brokers = cluster.ListenAddrs()
		c.RequestTimeout = 3 * time.Second
	})
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := in.Submit(principal(w.orgA, access.Live), intake.Submission{ContentType: intake.MediaFHIRNDJSON, Body: pr})
		done <- err
	}()
	list := make([]map[string]any, 600)
	for i := range list {
		list[i] = vital(w.synthA)
	}
	pw.Write(ndjson(t, list...))
	cluster.Close()
	pw.Write(ndjson(t, list...))
	pw.Close()
	if err := <-done; fault.KindOf(err) != fault.KindUnavailable {
		t.Fatalf("err %v; want 503", err)
	}
}

func TestBackpressure(t *testing.T) {
	w := newWorld(t)
	in := newIntake(t, w, func(c *intake.Config) {
		c.MaxLag = 20
		c.LagInterval = 50 * time.Millisecond
		c.RetryAfter = 3 * time.Second
	})
	ctx := principal(w.orgA, access.Live)
	list := make([]map[string]any, 50)
	for i := range list {
		list[i] = vital(w.synthA)
	}
	if _, err := submit(t, in, ctx, intake.MediaFHIRNDJSON, ndjson(t, list...)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the lag to pass the bound", func() bool { lag, fresh := in.Lag(); return fresh && lag > 20 })
	_, err := submit(t, in, ctx, intake.MediaFHIRJSON, mustJSON(t, vital(w.synthA)))
	if fault.KindOf(err) != fault.KindUnavailable || in.RetryAfter() != 3*time.Second {
		t.Fatalf("over the bound: %v; want 503", err)
	}
	startWriter(t, w)
	waitFor(t, "the writer to catch up", func() bool { lag, fresh := in.Lag(); return fresh && lag <= 20 })
	if _, err := submit(t, in, ctx, intake.MediaFHIRJSON, mustJSON(t, vital(w.synthA))); err != nil {
		t.Fatalf("under the bound again: %v", err)
	}
}

// TestBackpressureByTime: with no writer running, what intake accepts is stored in no time it
// can promise; once more waits than fits the latency budget (and the oldest waiting record's
// age says so) it refuses with 503 and a Retry-After, and accepts again when a writer has caught
// up.
func TestBackpressureByTime(t *testing.T) {
	w := newWorld(t)
	in := newIntake(t, w, func(c *intake.Config) {
		c.LatencyBudget = time.Second
		c.LagInterval = 20 * time.Millisecond
	})
	ctx := principal(w.orgA, access.Live)
	list := make([]map[string]any, 100)
	for i := range list {
		list[i] = vital(w.synthA)
	}
	body := ndjson(t, list...)
	accepted := 0
	deadline := time.Now().Add(30 * time.Second)
	var err error
	for err == nil {
		if time.Now().After(deadline) {
			t.Fatalf("accepted %d observations with no writer running, and never refused", accepted)
		}
		var res intake.Result
		if res, err = submit(t, in, ctx, intake.MediaFHIRNDJSON, body); err == nil {
			accepted += res.Answer.Accepted
		}
	}
	if fault.KindOf(err) != fault.KindUnavailable || !strings.Contains(err.Error(), "budget") {
		t.Fatalf("after %d accepted: %v; want 503 over the budget", accepted, err)
	}
	if ra := in.RetryAfter(); ra < time.Second || ra > 30*time.Second {
		t.Fatalf("Retry-After %v", ra)
	}
	t.Logf("refused after %d accepted, Retry-After %v: %v", accepted, in.RetryAfter(), err)
	startWriter(t, w)
	waitFor(t, "the writer to catch up", func() bool { lag, fresh := in.Lag(); return fresh && lag <= 64 })
	if _, err := submit(t, in, ctx, intake.MediaFHIRJSON, mustJSON(t, vital(w.synthA))); err != nil {
		t.Fatalf("within the budget again: %v", err)
	}
}

// TestAbortedTailKeepsIntakeOpen: a request whose records reached the broker and then aborted
// (here a stream over the entry limit; a device gone mid-request alike) leaves records at the
// partitions' tails that no writer commits past, so the group's lag stays at their count with
// nothing left to store. Intake must keep admitting: it once read that lag as a writer storing
// nothing and refused every request from then on, while only new records could have moved it.
func TestAbortedTailKeepsIntakeOpen(t *testing.T) {
	w := newWorld(t)
	in := newIntake(t, w, func(c *intake.Config) {
		c.LatencyBudget = time.Second
		c.LagInterval = 20 * time.Millisecond
		c.MaxEntries = 1100
	})
	startWriter(t, w)
	ctx := principal(w.orgA, access.Live)
	res, err := submit(t, in, ctx, intake.MediaFHIRJSON, mustJSON(t, vital(w.synthA)))
	if err != nil {
		t.Fatal(err)
	}
	waitStored(t, w, res.Answer.IDs)
	list := make([]map[string]any, 1101)
	for i := range list {
		list[i] = vital(w.synthA)
	}
	streamOverLimit(t, w, in, list)
	time.Sleep(time.Second) // fifty measurements of the aborted tail
	if lag, fresh := in.Lag(); !fresh || lag < 1000 {
		t.Logf("lag %d (fresh %v): the writer's offsets moved past the aborted records", lag, fresh)
	}
	res, err = submit(t, in, ctx, intake.MediaFHIRJSON, mustJSON(t, vital(w.synthA)))
	if err != nil {
		t.Fatalf("after an aborted request, with nothing waiting to be stored: %v", err)
	}
	waitStored(t, w, res.Answer.IDs)
}

// streamOverLimit streams list (1,001 entries or more) as NDJSON from organization A to an
// intake whose MaxEntries is under its length, and checks the answer is 413: the first 1,000 lines go out, and their
// records reach the broker, before the stream passes the limit, so their transaction aborts
// with records at the broker.
func streamOverLimit(t *testing.T, w *world, in *intake.Intake, list []map[string]any) {
	t.Helper()
	ctx := principal(w.orgA, access.Live)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := in.Submit(ctx, intake.Submission{ContentType: intake.MediaFHIRNDJSON, Body: pr})
		done <- err
	}()
	pw.Write(ndjson(t, list[:1000]...))
	waitFor(t, "the first chunks at the broker", func() bool { return endOffsets(t, w) >= 1000 })
	pw.Write(ndjson(t, list[1000:]...))
	pw.Close()
	if err := <-done; fault.KindOf(err) != fault.KindTooLarge {
		t.Fatalf("err %v; want 413", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, what, cond)
}

// TestConcurrentRequests ingests from many goroutines at once (more than there are producers):
// every accepted observation is stored once.
func TestConcurrentRequests(t *testing.T) {
	w := newWorld(t)
	in := newIntake(t, w)
	startWriter(t, w)
	var mu sync.Mutex
	var all []string
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Go(func() {
			for range 5 {
				list := make([]map[string]any, 40)
				for i := range list {
					list[i] = vital([]string{w.synthA, w.realA}[(g+i)%2])
				}
				res, err := submit(t, in, principal(w.orgA, access.Live), intake.MediaFHIRJSON, bundle(t, "batch", list...))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				all = append(all, res.Answer.IDs...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(all) != 12*5*40 {
		t.Fatalf("%d accepted", len(all))
	}
	waitStored(t, w, all)
	evs := waitEvents(t, w, all)
	for _, id := range all {
		if n := len(evs[observation.EventID(id)]); n != 1 {
			t.Fatalf("%d events for %s", n, id)
		}
	}
	if len(evs) != len(all) {
		t.Fatalf("%d events for %d observations", len(evs), len(all))
	}
}
