package observation_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"carehub/kernel/ids"
	"carehub/schemas"
	"carehub/schemas/kafka/observation"
)

// message returns a valid record value for patient of org.
func message(org, patient string, value float64) observation.Message {
	raw := fmt.Sprintf(`{"resourceType":"Observation","status":"final","code":{"coding":[{"system":"http://loinc.org","code":"8867-4"}]},`+
		`"subject":{"reference":"Patient/%s"},"effectiveDateTime":"2026-11-01T08:00:00Z","valueQuantity":{"value":%v,"unit":"/min"}}`, patient, value)
	return observation.Message{ID: ids.New(ids.Observation), OrgID: org, PatientID: patient, ReceivedAt: time.Now().UTC(),
		Observation: json.RawMessage(raw), Status: "final", LOINC: "8867-4", Code: "8867-4", Value: value, Unit: "/min",
		EffectiveAt: time.Date(2026, 11, 1, 8, 0, 0, 0, time.UTC), DeviceType: "wearable"}
}

func TestMessageRoundTrip(t *testing.T) {
	m := message("org_1", "pat_1", 72.25)
	m.ID = "obs_01ke9nk500cmm0mhj9psxg961n"
	m.DeviceType = "monitor \"7\"\\\n\t\x01 é"
	m.ClientID = "c-1"
	m.ReceivedAt = time.Date(2026, 11, 1, 8, 0, 1, 123456789, time.UTC)
	b := m.AppendJSON(nil)
	if !json.Valid(b) {
		t.Fatalf("invalid JSON: %s", b)
	}
	got, err := observation.DecodeMessage(b)
	if err != nil {
		t.Fatal(err)
	}
	std, _ := json.Marshal(m)
	again, _ := json.Marshal(got)
	if string(std) != string(again) {
		t.Fatalf("round trip:\n%s\n%s", std, again)
	}
	for _, bad := range []string{`{`, `{"id":"obs_x"}`, strings.Replace(string(b), `"observation":{`, `"observation":[{`, 1)[:len(b)] + `}`} {
		if _, err := observation.DecodeMessage([]byte(bad)); err == nil {
			t.Errorf("DecodeMessage(%.60s) accepted", bad)
		}
	}
	if observation.EventID(m.ID) != "evt_01ke9nk500cmm0mhj9psxg961n" {
		t.Fatal(observation.EventID(m.ID))
	}
}

// TestMessageMatchesTopicSchema checks a message as intake encodes it against the topic's JSON
// Schema (schemas/kafka/observations.v1.json): every required property, the id pattern, and the
// required elements of the FHIR Observation.
func TestMessageMatchesTopicSchema(t *testing.T) {
	raw, err := schemas.Kafka.ReadFile("kafka/observations.v1.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Required   []string `json:"required"`
		Properties map[string]struct {
			Pattern  string   `json:"pattern"`
			Required []string `json:"required"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	m := message("org_1", "pat_1", 72)
	var got map[string]json.RawMessage
	if err := json.Unmarshal(m.AppendJSON(nil), &got); err != nil {
		t.Fatal(err)
	}
	for _, name := range schema.Required {
		if _, ok := got[name]; !ok {
			t.Errorf("required property %s missing", name)
		}
	}
	if p := schema.Properties["id"].Pattern; !regexp.MustCompile(p).MatchString(m.ID) {
		t.Errorf("id %s does not match %s", m.ID, p)
	}
	var o map[string]json.RawMessage
	_ = json.Unmarshal(got["observation"], &o)
	for _, name := range schema.Properties["observation"].Required {
		if _, ok := o[name]; !ok {
			t.Errorf("observation.%s missing", name)
		}
	}
	for name := range got {
		if _, ok := schema.Properties[name]; !ok {
			t.Logf("property %s is not described by the schema (additional properties are allowed)", name)
		}
	}
}
