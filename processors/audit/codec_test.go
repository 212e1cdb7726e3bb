package audit

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"carehub/storage"
)

// FuzzCodec holds the audit topic's codec to encoding/json: decode accepts what json.Unmarshal
// into a storage.AuditRecord accepts (and the record's id, operation and time are set) and reads
// the same record, and encode writes what json.Unmarshal reads back as the record encoded.
//
//	go test -run '^$' -fuzz FuzzCodec -fuzztime 60s ./processors/audit/
func FuzzCodec(f *testing.F) {
	valid := `{"id":"req_01ke9nk500cmm0mhj9psxg961n","time":"2026-11-27T14:31:30.123456789Z","orgId":"org_1","keyId":"key_1","mode":"live",` +
		`"clientIp":"127.0.0.1","userAgent":"curl/8.5","operation":"graphql mutation publishEvent","resourceIds":["evt_1","prj_1"],` +
		`"patientIds":[],"outcome":"success","status":200,"latencyMs":3,"truncated":false,"patientIdsOmitted":0,"resourceIdsOmitted":0}`
	for _, s := range []string{
		valid,
		strings.Replace(valid, `"status":200`, `"STATUS":201,"status":null`, 1),
		strings.Replace(valid, `"status":200`, `"status":2e2`, 1),
		strings.Replace(valid, `"status":200`, `"status":200.0`, 1),
		strings.Replace(valid, `"status":200`, `"status":"200"`, 1),
		strings.Replace(valid, `"latencyMs":3`, `"latencyMs":-0`, 1),
		strings.Replace(valid, `"latencyMs":3`, `"latencyMs":9223372036854775808`, 1),
		strings.Replace(valid, `"patientIds":[]`, `"patientIds":null`, 1),
		strings.Replace(valid, `"patientIds":[]`, `"patientIds":["pat_1",null,"pat_\u00e9\n"]`, 1),
		strings.Replace(valid, `"patientIds":[]`, `"patientIds":["pat_1",2]`, 1),
		strings.Replace(valid, `"patientIds":[]`, `"patientIds":{}`, 1),
		strings.Replace(valid, `"truncated":false`, `"truncated":"yes"`, 1),
		strings.Replace(valid, `"userAgent":"curl/8.5"`, `"userAgent":"é\u0026\ud800 <x>"`, 1),
		strings.Replace(valid, `"time":"2026-11-27T14:31:30.123456789Z"`, `"time":"yesterday"`, 1),
		strings.Replace(valid, `"operation":"graphql mutation publishEvent"`, `"operation":""`, 1),
		strings.Replace(valid, `"resourceIdsOmitted":0}`, `"resourceIdsOmitted":0,"authFailure":"revoked","credential":"chk_live_…AbCd","extra":[{"a":1}]}`, 1),
		` ` + valid + "\n", `[` + valid + `]`, `null`, `{}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		var want storage.AuditRecord
		wantErr := json.Unmarshal([]byte(data), &want)
		if wantErr == nil && (want.ID == "" || want.Operation == "" || want.Time.IsZero()) {
			wantErr = errIncomplete
		}
		got, err := decode([]byte(data))
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("decode(%q): error %v, encoding/json: %v", data, err, wantErr)
		}
		if err != nil {
			return
		}
		if !equalRecords(got, want) {
			t.Fatalf("decode(%q):\n%+v\nencoding/json:\n%+v", data, got, want)
		}

		b, err := encode(got)
		_, wantErr = json.Marshal(got)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("encode(%+v): error %v, encoding/json: %v", got, err, wantErr)
		}
		if err != nil {
			return
		}
		var back storage.AuditRecord
		if err := json.Unmarshal(b, &back); err != nil || !equalRecords(back, got) {
			t.Fatalf("encode(%+v) = %s: reads back as %+v (%v)", got, b, back, err)
		}
	})
}

var errIncomplete = errors.New("incomplete")

func equalRecords(a, b storage.AuditRecord) bool {
	if !a.Time.Equal(b.Time) {
		return false
	}
	a.Time, b.Time = time.Time{}, time.Time{}
	return reflect.DeepEqual(a, b)
}

// TestEncodeIsJSONMarshal: for records as the auditor makes them, encode writes json.Marshal's
// bytes but for <, > and &, which it leaves as themselves.
func TestEncodeIsJSONMarshal(t *testing.T) {
	at := time.Date(2026, 11, 27, 14, 31, 30, 120000000, time.UTC)
	for _, rec := range []storage.AuditRecord{
		{ID: "req_1", Time: at, Operation: "GET /v1/patients/{id}", Outcome: "success", Status: 200},
		{ID: "req_2", Time: at.In(time.FixedZone("x", 3600)), OrgID: "org_1", KeyID: "key_1", Mode: "test", ClientIP: "::1",
			UserAgent: "Mozilla/5.0 \"quoted\" \\ \t\u2028", Operation: "graphql query patient", ResourceIDs: []string{},
			PatientIDs: []string{"pat_1", "pat_2"}, Outcome: "denied", Status: 403, LatencyMs: 12, Truncated: true,
			PatientIDsOmitted: 3, ResourceIDsOmitted: -1, AuthFailure: "expired", Credential: "jwt"},
		{ID: "req_3", Time: at, UserAgent: "bad \xff utf-8 <b>", Operation: "x", Outcome: "error", Status: 500},
	} {
		got, err := encode(rec)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(rec)
		if rec.ID != "req_3" { // the fall-back is json.Marshal itself
			want = []byte(strings.NewReplacer(`\u003c`, "<", `\u003e`, ">", `\u0026`, "&", `\u2028`, "\u2028").Replace(string(want)))
		}
		if string(got) != string(want) {
			t.Errorf("encode:\n%s\njson.Marshal:\n%s", got, want)
		}
	}
}

// BenchmarkCodec compares encode and decode with encoding/json on a publishEvent call's record.
func BenchmarkCodec(b *testing.B) {
	rec := storage.AuditRecord{ID: "req_01ke9nk500cmm0mhj9psxg961n", Time: time.Now(), OrgID: "org_01ke9nk500cmm0mhj9psxg961n",
		KeyID: "key_01ke9nk500cmm0mhj9psxg961n", Mode: "live", ClientIP: "127.0.0.1", UserAgent: "Go-http-client/1.1",
		Operation: "graphql mutation publishEvent", ResourceIDs: []string{"evt_01ke9nk500cmm0mhj9psxg961n", "prj_01ke9nk500cmm0mhj9psxg961n"},
		PatientIDs: []string{"pat_01ke9nk500cmm0mhj9psxg961n"}, Outcome: "success", Status: 200, LatencyMs: 2}
	data, _ := json.Marshal(rec)
	b.Run("encode", func(b *testing.B) {
		for b.Loop() {
			if _, err := encode(rec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode/std", func(b *testing.B) {
		for b.Loop() {
			if _, err := json.Marshal(rec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		for b.Loop() {
			if _, err := decode(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode/std", func(b *testing.B) {
		for b.Loop() {
			var a storage.AuditRecord
			if err := json.Unmarshal(data, &a); err != nil {
				b.Fatal(err)
			}
		}
	})
}
