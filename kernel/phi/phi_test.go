package phi_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"carehub/kernel/events"
	"carehub/kernel/phi"
)

// namesPatient reports whether a catalogue field looks like it could carry a patient's identity.
func namesPatient(field string) bool {
	l := strings.ToLower(field)
	return phi.IsPatientKey(field) || strings.Contains(l, "patient") || strings.Contains(l, "subject")
}

// TestEventsClassifyTheCatalogue: every catalogued event type with a field naming a patient has a
// class, and a class decides every field of its type, so a field added to the catalogue cannot
// reach readers unclassified.
func TestEventsClassifyTheCatalogue(t *testing.T) {
	for _, et := range events.Catalogue {
		c, classified := phi.EventClassOf(et.Type)
		for _, f := range et.Payload {
			if namesPatient(f.Name) && !classified {
				t.Errorf("%s.%s names a patient but %s has no phi.EventClass", et.Type, f.Name, et.Type)
			}
		}
		if !classified {
			continue
		}
		var fields []string
		for _, f := range et.Payload {
			fields = append(fields, f.Name)
			inFields, inKeep := slices.Contains(c.Fields, f.Name), slices.Contains(c.Keep, f.Name)
			switch {
			case inFields && inKeep:
				t.Errorf("%s.%s is both patient data and kept", et.Type, f.Name)
			case !inFields && !inKeep:
				t.Errorf("%s.%s is catalogued but not classified: add it to phi.Events' Fields (patient data) or Keep", et.Type, f.Name)
			case inKeep && namesPatient(f.Name):
				t.Errorf("%s.%s names a patient but is kept in redacted payloads", et.Type, f.Name)
			}
		}
		for _, f := range append(slices.Clone(c.Fields), c.Keep...) {
			if !slices.Contains(fields, f) {
				t.Errorf("phi.Events classifies %s.%s, which the catalogue does not list", et.Type, f)
			}
		}
		if c.Need != phi.NeedPatients && c.Need != phi.NeedObservations {
			t.Errorf("%s has no need", et.Type)
		}
	}
	for _, c := range phi.Events {
		if _, ok := events.Lookup(c.Type); !ok {
			t.Errorf("phi.Events classifies %s, which is not in the catalogue", c.Type)
		}
	}
}

func TestPatients(t *testing.T) {
	for _, tc := range []struct {
		payload string
		want    phi.Naming
	}{
		{`{"patientId": "pat_1", "value": 3}`, phi.Naming{IDs: []string{"pat_1"}, Named: true}},
		{`{"patient_id": "pat_2"}`, phi.Naming{IDs: []string{"pat_2"}, Named: true}},
		{`{"note": {"subject": {"reference": "Patient/pat-3"}}}`, phi.Naming{IDs: []string{"pat_3"}, Named: true}},
		{`{"PatientIDs": ["pat_4", "Patient/pat_5", "pat_4"]}`, phi.Naming{IDs: []string{"pat_4", "pat_5"}, Named: true}},
		{`{"patient": {"id": "pat_6", "name": "x"}}`, phi.Naming{IDs: []string{"pat_6"}, Named: true}},
		{`{"entries": [{"patient-id": "pat_7"}]}`, phi.Naming{IDs: []string{"pat_7"}, Named: true}},
		{`{"patient": {"name": [{"family": "Doe"}]}}`, phi.Naming{Named: true, Unidentified: true}},
		{`{"subject": 42}`, phi.Naming{Named: true, Unidentified: true}},
		{`{"patients": ["pat_8", {"name": "Doe"}]}`, phi.Naming{IDs: []string{"pat_8"}, Named: true, Unidentified: true}},
		{`{"patientId": ""}`, phi.Naming{Named: true, Unidentified: true}},
		{`{"runId": "run_1", "status": "COMPLETED", "note": "patient stable"}`, phi.Naming{}},
		{`{"deploymentId": "dep_1"}`, phi.Naming{}},
		{`not json`, phi.Naming{}},
	} {
		if got := phi.Patients(json.RawMessage(tc.payload)); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Patients(%s) = %+v, want %+v", tc.payload, got, tc.want)
		}
	}
	// Several values: a run's input and output.
	got := phi.Patients(json.RawMessage(`{"patient_id": "pat_1"}`), nil, json.RawMessage(`{"patientId": "pat_1", "steps": []}`))
	if want := (phi.Naming{IDs: []string{"pat_1"}, Named: true}); !reflect.DeepEqual(got, want) {
		t.Errorf("Patients(input, output) = %+v, want %+v", got, want)
	}
}

func TestClassifyEvent(t *testing.T) {
	for _, tc := range []struct {
		typ, payload string
		classified   bool
		want         phi.Subject
	}{
		{"device.observation_received", `{"patientId": "pat_1", "value": 38.2}`, true, phi.Subject{Patients: []string{"pat_1"}, Need: phi.NeedObservations}},
		{"agent.run_completed", `{"sessionId": "ses_1", "patientId": "pat_1"}`, true, phi.Subject{Patients: []string{"pat_1"}, Need: phi.NeedPatients}},
		// A classified type is classified even when its payload lost the patient.
		{"diagnostic.result_ready", `{"reportId": "rep_1"}`, true, phi.Subject{Need: phi.NeedPatients}},
		// Any other payload naming a patient is free-form patient data.
		{"integration.vitals", `{"patient_id": "pat_2", "hr": 130}`, true, phi.Subject{Patients: []string{"pat_2"}, Need: phi.NeedObservations}},
		{"workflow.completed", `{"runId": "run_1", "subject": "Patient/pat-3"}`, true, phi.Subject{Patients: []string{"pat_3"}, Need: phi.NeedObservations}},
		{"integration.note", `{"patient": {"name": "Doe"}}`, true, phi.Subject{Unidentified: true, Need: phi.NeedObservations}},
		{"workflow.completed", `{"runId": "run_1", "status": "COMPLETED"}`, false, phi.Subject{}},
		{"integration.heartbeat", `{"ok": true}`, false, phi.Subject{}},
	} {
		got, ok := phi.ClassifyEvent(tc.typ, json.RawMessage(tc.payload))
		if ok != tc.classified || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ClassifyEvent(%s, %s) = %+v, %v; want %+v, %v", tc.typ, tc.payload, got, ok, tc.want, tc.classified)
		}
	}
}

func TestRedactPayload(t *testing.T) {
	for _, tc := range []struct {
		typ, payload, want string
	}{
		{"device.observation_received",
			`{"observationId": "obs_1", "patientId": "pat_1", "code": "8867-4", "deviceType": "watch", "value": 131, "unit": "/min", "effectiveAt": "2024-05-01T12:00:00Z", "extra": "x"}`,
			`{"code":"8867-4","deviceType":"watch","observationId":"obs_1"}`},
		{"agent.run.failed", `{"sessionId": "ses_1", "agentId": "agt_1", "patientId": "pat_1", "status": "FAILED", "error": "no respiratory rate"}`,
			`{"agentId":"agt_1","sessionId":"ses_1","status":"FAILED"}`},
		// A kept field whose value names a patient is dropped too.
		{"diagnostic.result_ready", `{"reportId": {"patientId": "pat_1"}, "code": "news2"}`, `{"code":"news2"}`},
		// A catalogued type without a class keeps its catalogue fields, nothing else.
		{"workflow.completed", `{"runId": "run_1", "status": "COMPLETED", "patientId": "pat_1", "vitals": {"hr": 130}}`,
			`{"runId":"run_1","status":"COMPLETED"}`},
		// An uncatalogued type keeps nothing.
		{"integration.vitals", `{"patient_id": "pat_2", "hr": 130, "note": "febrile"}`, `{}`},
		{"integration.vitals", `not json`, `{}`},
	} {
		if got := string(phi.RedactPayload(tc.typ, json.RawMessage(tc.payload))); got != tc.want {
			t.Errorf("RedactPayload(%s, %s) = %s, want %s", tc.typ, tc.payload, got, tc.want)
		}
	}
}

func TestPatientID(t *testing.T) {
	for in, want := range map[string]string{"pat_1": "pat_1", "pat-1": "pat_1", "Patient/pat-1": "pat_1", " Patient/pat_1 ": "pat_1", "x": "x"} {
		if got := phi.PatientID(in); got != want {
			t.Errorf("PatientID(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestReaderGrantRoundTrip(t *testing.T) {
	for _, r := range []phi.Reader{{}, {Patients: true}, {Patients: true, Observations: true}, {Patients: true, Observations: true, Live: true}, {Live: true}} {
		if got := phi.ReaderFrom(r.Grant()); got != r {
			t.Errorf("ReaderFrom(%v.Grant()) = %v", r, got)
		}
	}
	full := phi.Reader{Patients: true, Observations: true, Live: true}
	if got := full.And(phi.Reader{Patients: true}); got != (phi.Reader{Patients: true}) {
		t.Errorf("And = %v", got)
	}
}

func TestEscapedPatientKeyIsClassified(t *testing.T) {
	n := phi.Patients(json.RawMessage(`{"p\u0061tientId":"pat_1"}`))
	if !n.Named || len(n.IDs) != 1 || n.IDs[0] != "pat_1" {
		t.Fatalf("an escaped patient key: %+v, want pat_1 named", n)
	}
	if phi.Patients(json.RawMessage(`{"PATIENT":"pat_2"}`)).IDs[0] != "pat_2" {
		t.Fatal("an upper-case patient key is not classified")
	}
}
