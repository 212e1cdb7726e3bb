package observation_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"carehub/schemas/kafka/observation"
)

// stdDecode is DecodeMessage as encoding/json does it: the reference the hand-written decoder
// must agree with.
func stdDecode(value []byte) (observation.Message, error) {
	var m observation.Message
	if err := json.Unmarshal(value, &m); err != nil {
		return observation.Message{}, err
	}
	return m, m.Check()
}

// FuzzDecodeMessage checks DecodeMessage against encoding/json on any input: both accept it or
// both refuse it, and what both accept decodes to the same Message.
//
//	go test -run '^$' -fuzz FuzzDecodeMessage -fuzztime 60s ./schemas/kafka/observation/
func FuzzDecodeMessage(f *testing.F) {
	m := message("org_1", "pat_1", 72.25)
	m.ID = "obs_01ke9nk500cmm0mhj9psxg961n"
	m.ClientID = "c-1"
	valid := string(m.AppendJSON(nil))
	f.Add(valid)
	m.DeviceType, m.NoValue, m.Value = "monitor \"7\"\\\n\t\x01 é <&>", true, -1.5e-7
	f.Add(string(m.AppendJSON(nil)))
	for _, s := range []string{
		strings.Replace(valid, `"status"`, `"STATUS"`, 1),
		strings.Replace(valid, `"code":"8867-4"`, `"code":"8867-4","code":null`, 1),
		strings.Replace(valid, `"unit":"/min"`, `"unit":"\u002fmin\ud800"`, 1),
		strings.Replace(valid, `"unit":"/min"`, "\"unit\":\"/m\xffin\"", 1),
		strings.Replace(valid, `"value":72.25`, `"value":"72"`, 1),
		strings.Replace(valid, `"value":72.25`, `"value":1e400`, 1),
		strings.Replace(valid, `"orgId"`, `"org\u0049d"`, 1),
		strings.Replace(valid, `"clientId":"c-1"`, `"clientId":"c-1","extra":[1,{"a":"}"}],"noValue":null`, 1),
		strings.Replace(valid, `"observation":{`, `"observation" : null, "observation":  {`, 1),
		strings.Replace(valid, `"observation":{`, `"observation":{"note":[{"text":"\u0000"}],`, 1),
		strings.Replace(valid, `"effectiveAt":"2026-11-01T08:00:00Z"`, `"effectiveAt":"2026-11-01 08:00:00"`, 1),
		` ` + valid + "\n",
		`[` + valid + `]`,
		`null`, `{}`, `{"id":1}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		want, wantErr := stdDecode([]byte(value))
		got, err := observation.DecodeMessage([]byte(value))
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("DecodeMessage(%q): error %v, encoding/json: %v", value, err, wantErr)
		}
		if err != nil {
			return
		}
		if !want.ReceivedAt.Equal(got.ReceivedAt) || !want.EffectiveAt.Equal(got.EffectiveAt) {
			t.Fatalf("DecodeMessage(%q): times %v %v, encoding/json: %v %v", value, got.ReceivedAt, got.EffectiveAt, want.ReceivedAt, want.EffectiveAt)
		}
		want.ReceivedAt, want.EffectiveAt, got.ReceivedAt, got.EffectiveAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("DecodeMessage(%q):\n%+v\nencoding/json:\n%+v", value, got, want)
		}
	})
}

// BenchmarkDecodeMessage compares DecodeMessage with json.Unmarshal of the same record (std).
func BenchmarkDecodeMessage(b *testing.B) {
	m := message("org_01ke9nk500cmm0mhj9psxg961n", "pat_01ke9nk500cmm0mhj9psxg961n", 72.25)
	value := m.AppendJSON(nil)
	b.Run("hand", func(b *testing.B) {
		b.SetBytes(int64(len(value)))
		for b.Loop() {
			if _, err := observation.DecodeMessage(value); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("std", func(b *testing.B) {
		b.SetBytes(int64(len(value)))
		for b.Loop() {
			if _, err := stdDecode(value); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkValid(b *testing.B) {
	m := message("org_01ke9nk500cmm0mhj9psxg961n", "pat_01ke9nk500cmm0mhj9psxg961n", 72.25)
	value := m.AppendJSON(nil)
	for b.Loop() {
		json.Valid(value)
	}
}
