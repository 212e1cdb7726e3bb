package attacktest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/kernel/ids"
	"carehub/storage/demo"
	"carehub/storage/kafka"
	"carehub/storage/kafka/consume"
	"carehub/storage/kafka/kafkatest"
)

// logPatience bounds how long a test waits for an event to reach the log (a second or two
// normally); a log that has stopped fails the test instead of hanging it.
const logPatience = 90 * time.Second

// TestPoisonPayloadRefusedAtTheDoor: finding 1 of issue 51. A payload number JSON allows but
// Postgres numeric cannot hold (1e999999, an integer of 200,000 digits) or a string with an
// unpaired surrogate escape was acknowledged 202; the event log writer then failed its batch
// and retried it forever, and no tenant's event reached the log again. Each must be refused
// with a 400 naming the field, and another tenant's event must still reach the log.
func TestPoisonPayloadRefusedAtTheDoor(t *testing.T) {
	s := servertest.Start(t)
	attacker := s.Key(demo.DemoOrgSlug, access.Test, access.ExecWorkflows)
	project := s.ProjectID(demo.SepsisProjectName)
	poisons := map[string]string{
		"payload.n":      `{"n":1e999999}`,
		"payload.s":      `{"s":"\ud800"}`,
		"payload.big":    `{"big":` + strings.Repeat("7", 200000) + `}`,
		"payload.tiny":   `{"tiny":1e-999999}`,
		"payload.a[1].k": `{"a":[1,{"k":"x\udfff"}]}`,
		"ud800":          `{"\ud800":1}`, // the name is quoted, escaped
	}
	for field, payload := range poisons {
		body := fmt.Sprintf(`{"projectId":%q,"type":"attack.poison","payload":%s}`, project, payload)
		for _, b := range []string{body, "[" + body + "]"} {
			r := s.Do(http.MethodPost, "/v1/events", attacker, b)
			if r.Status != http.StatusBadRequest {
				t.Errorf("publish %.60s: %d %.300s, want 400", b, r.Status, r.Body)
				continue
			}
			if !strings.Contains(string(r.Body), `"code"`) || !strings.Contains(string(r.Body), strings.TrimPrefix(field, "payload.")) {
				t.Errorf("publish %.60s: the error envelope does not name %s: %.300s", b, field, r.Body)
			}
		}
	}
	// The same through GraphQL, with the payload as a variable and as a literal.
	const publish = `mutation($p: ID!, $payload: JSON!) { publishEvent(projectId: $p, type: "attack.poison", payload: $payload) { id } }`
	var huge map[string]any
	if err := json.Unmarshal([]byte(`{"n":`+strings.Repeat("9", 5000)+`}`), &huge); err == nil {
		if r := s.GraphQL(attacker, publish, map[string]any{"p": project, "payload": huge}); len(r.Errors) == 0 {
			t.Errorf("publishEvent with a 5,000-digit number was accepted: %s", r.Data)
		}
	}
	for _, lit := range []string{`{n: 1e999999}`, `{n: ` + strings.Repeat("9", 5000) + `}`} {
		q := fmt.Sprintf(`mutation { publishEvent(projectId: %q, type: "attack.poison", payload: %s) { id } }`, project, lit)
		if r := s.GraphQL(attacker, q, nil); len(r.Errors) == 0 {
			t.Errorf("publishEvent with the literal %.40s was accepted: %s", lit, r.Data)
		}
	}

	// Finding 12: an unpaired surrogate in a Patient answered 500 (jsonb refused it).
	fhirKey := s.Key(demo.DemoOrgSlug, access.Live, access.WritePatients, access.ReadPatients)
	r := s.Do(http.MethodPost, "/fhir/R4/Patient", fhirKey,
		`{"resourceType":"Patient","name":[{"family":"Poison\ud800","given":["A"]}],"gender":"female","birthDate":"1990-01-01"}`)
	if r.Status != http.StatusBadRequest || !strings.Contains(string(r.Body), "OperationOutcome") {
		t.Errorf("FHIR Patient with an unpaired surrogate: %d %.300s, want 400 OperationOutcome", r.Status, r.Body)
	}

	// Another tenant's event reaches the log.
	other := s.Key("northwind-health", access.Live, access.ExecWorkflows, access.ReadPatients)
	otherProject := s.ProjectID("Inpatient Deterioration")
	waitInLog(t, s, other, otherProject, publishGood(t, s, other, otherProject))
}

// TestPoisonRecordDeadLettered: finding 1 of issue 51, behind the door. A record the log's
// store refuses, produced to the events topic directly (a bug, another producer, a store with
// other limits), must not stop the log: it goes to the dead-letter topic with its source
// position, and the events after it, of every tenant, are stored. Postgres refuses all three
// payloads; ClickHouse keeps a payload as a String and stores them. On either, each poison
// event ends in exactly one place, the log or the dead-letter topic: none is lost.
func TestPoisonRecordDeadLettered(t *testing.T) {
	s := servertest.Start(t)
	project := s.ProjectID(demo.SepsisProjectName)
	cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: s.Brokers(), Credentials: s.KafkaCredentials(), ClientID: "attacktest"})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	poisons := []string{`{"n":1e999999}`, `{"s":"\ud800"}`, `{"big":` + strings.Repeat("7", 200000) + `}`}
	var poisonIDs []string
	for _, payload := range poisons {
		id := ids.New(ids.Event)
		poisonIDs = append(poisonIDs, id)
		value := fmt.Sprintf(`{"id":%q,"type":"attack.poison","orgId":%q,"projectId":%q,"source":"integration","severity":"info","payload":%s,"createdAt":%q}`,
			id, s.OrgID(demo.DemoOrgSlug), project, payload, time.Now().UTC().Format(time.RFC3339Nano))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := cl.ProduceSync(ctx, &kgo.Record{Topic: s.Topics().Events, Key: []byte(project), Value: []byte(value)}).FirstErr()
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	key := s.Key(demo.DemoOrgSlug, access.Live, access.ExecWorkflows, access.ReadPatients)
	waitInLog(t, s, key, project, publishGood(t, s, key, project))
	other := s.Key("northwind-health", access.Live, access.ExecWorkflows, access.ReadPatients)
	otherProject := s.ProjectID("Inpatient Deterioration")
	waitInLog(t, s, other, otherProject, publishGood(t, s, other, otherProject))

	dead := map[string]consume.DeadLettered{}
	for _, rec := range kafkatest.ReadAll(t, s.Topics().EventsDLQ) {
		d, err := consume.ReadDeadLettered(rec)
		if err != nil {
			continue // ReadAll's end markers
		}
		for _, id := range poisonIDs { // encoding/json cannot read these values
			if bytes.Contains(d.Record.Value, []byte(id)) {
				dead[id] = d
			}
		}
	}
	stored := s.Do(http.MethodGet, "/v1/events?limit=100&types=attack.*&projectId="+project, key, nil)
	postgresLog := os.Getenv("CAREHUB_CLICKHOUSE_URL") == "" // servertest's choice of event log
	for _, id := range poisonIDs {
		d, deadLettered := dead[id]
		inLog := strings.Contains(string(stored.Body), id)
		switch {
		case deadLettered && inLog:
			t.Errorf("the poison event %s is both in the log and on the dead-letter topic", id)
		case !deadLettered && !inLog:
			t.Errorf("the poison event %s is neither in the log nor on the dead-letter topic: lost", id)
		case postgresLog && !deadLettered:
			t.Errorf("Postgres stored the poison event %s, which it cannot hold", id)
		case deadLettered && (d.SourceTopic != s.Topics().Events || d.Consumer != "eventlog" ||
			!strings.Contains(d.Error, "SQLSTATE") && !strings.Contains(d.Error, "refuses")):
			t.Errorf("dead letter %s: source %s consumer %q error %q", id, d.SourceTopic, d.Consumer, d.Error)
		}
	}
}

// publishGood publishes an ordinary event with key to project and returns its id.
func publishGood(t *testing.T, s *servertest.Server, key, project string) string {
	t.Helper()
	r := s.Do(http.MethodPost, "/v1/events", key, map[string]any{"projectId": project, "type": "attack.after_poison",
		"payload": map[string]any{"n": 1.5, "s": "ok"}})
	if r.Status != http.StatusAccepted {
		t.Fatalf("publish an ordinary event: %d %s", r.Status, r.Body)
	}
	var out struct{ Data []struct{ ID string } }
	r.JSON(t, &out)
	return out.Data[0].ID
}

// waitInLog waits until GET /v1/events of project lists the event id.
func waitInLog(t *testing.T, s *servertest.Server, key, project, id string) {
	t.Helper()
	servertest.Eventually(t, logPatience, "the event "+id+" to reach the log", func() bool {
		r := s.Do(http.MethodGet, "/v1/events?limit=100&types=attack.after_poison&projectId="+project, key, nil)
		return r.Status == http.StatusOK && strings.Contains(string(r.Body), id)
	})
}
