// Package phi is carehub's one classification of patient data (PHI) and its enforcement
// (DECISIONS §2, docs/SECURITY.md "Patient data (PHI)").
//
// # What is classified
//
// This file is the classification; nothing else decides what patient data is:
//
//   - Event payloads: the catalogued event types of Events, field by field, and any other event
//     whose payload names a patient (a key of PatientKeys at any depth), which is patient data
//     whole: a client's publishEvent payload is free-form, so nothing in it is known to be safe.
//   - AgentSession (patientId, input, output, error) and WorkflowRun (input, output) when it
//     names a patient, and the result of invoking a deployment on a stored patient.
//   - FHIR resources (Patient, Observation, Encounter, RiskAssessment), which are patient data
//     whole and are guarded by scope in processors/patients: a caller without the scope gets no
//     resource at all, rather than a redacted one.
//
// # The rule
//
// Patient data is served to a reader (Reader) that holds read:patients, and also
// read:observations for records of NeedObservations (those carrying observation values or what
// was computed from them), and, for a real (non-synthetic) patient, only in live mode: a test
// credential sees the patient data of synthetic patients only. Any other reader gets the record
// with its patient fields removed and a redacted flag. Guard applies the rule; every response
// that carries patient data touches (access.Touch) each patient it names, for the audit record.
package phi

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"

	"carehub/kernel/access"
	"carehub/kernel/events"
)

// Need is what reading a classified record requires, besides seeing its patients.
type Need uint8

// Needs, ordered: NeedObservations includes NeedPatients.
const (
	// NeedPatients is read:patients.
	NeedPatients Need = iota + 1
	// NeedObservations is read:patients and read:observations: the record carries observation
	// values, or scores and components computed from them.
	NeedObservations
)

// Scopes returns the scopes n requires.
func (n Need) Scopes() []string {
	if n >= NeedObservations {
		return []string{access.ReadPatients, access.ReadObservations}
	}
	return []string{access.ReadPatients}
}

// EventClass classifies the payload of one catalogued event type that names a patient, field by
// field: every field of the type's catalogue entry is either patient data (Fields) or not (Keep),
// and a test fails when the catalogue gains a field that is neither. A redacted payload keeps the
// Keep fields only, so a field that reaches a payload without being catalogued is dropped too.
type EventClass struct {
	Type   string
	Fields []string // patient data
	Keep   []string // not patient data: ids of other resources, states, counts
	Need   Need
}

// Events classifies every catalogued event type whose payload names a patient. A test checks it
// against events.Catalogue: a catalogue type with a field that names a patient must be listed.
var Events = []EventClass{
	{Type: events.TypeAgentSessionUpdated, Need: NeedPatients, Fields: []string{"patientId"},
		Keep: []string{"sessionId", "agentId", "status", "latencyMs", "tokensUsed", "startedAt", "completedAt"}},
	{Type: events.TypeAgentRunCompleted, Need: NeedPatients, Fields: []string{"patientId"},
		Keep: []string{"sessionId", "agentId", "status", "latencyMs", "tokensUsed"}},
	// error names the vital signs the patient has no observation of.
	{Type: events.TypeAgentRunFailed, Need: NeedPatients, Fields: []string{"patientId", "error"},
		Keep: []string{"sessionId", "agentId", "status", "latencyMs", "tokensUsed"}},
	// effectiveAt is a date of the patient's care, which HIPAA counts as an identifier.
	{Type: events.TypeDeviceObservationReceived, Need: NeedObservations, Fields: []string{"patientId", "value", "unit", "effectiveAt"},
		Keep: []string{"observationId", "code", "deviceType"}},
	{Type: events.TypeDiagnosticResultReady, Need: NeedPatients, Fields: []string{"patientId", "conclusion"},
		Keep: []string{"reportId", "code", "severity"}},
	// probability is computed from the patient's vital signs, as an invoke result's score is.
	{Type: events.TypeDeploymentPrediction, Need: NeedObservations, Fields: []string{"patientId", "probability"},
		Keep: []string{"deploymentId", "observationId", "model"}},
}

// FreeForm is the class of an event of any other type whose payload names a patient (a client's
// publishEvent, say): nothing in it is known not to be patient data, so every field is, except
// the catalogue fields of its type when it has a catalogue entry (which names no patient), and
// reading it needs both scopes.
var FreeForm = EventClass{Need: NeedObservations}

// RecordClass classifies an API object that carries patient data.
type RecordClass struct {
	Object string   // the GraphQL type (REST uses the same field names)
	Fields []string // its patient-data fields; the others are served to every reader
	Need   Need
}

// The classified API objects.
var (
	// AgentSession is always classified: a session runs against one patient, and its input and
	// output carry that patient's observations and the scores computed from them.
	AgentSession = RecordClass{Object: "AgentSession", Fields: []string{"patientId", "input", "output", "error"}, Need: NeedObservations}
	// WorkflowRun is classified when its input or output names a patient.
	WorkflowRun = RecordClass{Object: "WorkflowRun", Fields: []string{"input", "output"}, Need: NeedObservations}
	// InvokeResult is the answer of POST /v1/deployments/{id}/invoke given a patientId (scores
	// of the patient's stored observations); given inline vitals it names no patient.
	InvokeResult = RecordClass{Object: "InvokeResult", Fields: []string{"patientId", "output"}, Need: NeedObservations}
)

// Records lists the classified API objects, for the tests that cross them with every path.
var Records = []RecordClass{AgentSession, WorkflowRun, InvokeResult}

// PatientKeys are the JSON keys that name a patient, compared without case, '_' and '-'
// (patient_id, PatientID and patient-id are all patientId). A value under one of them is a
// patient id, a FHIR reference ("Patient/pat-…"), a list of them, or an object whose id or
// reference is one.
var PatientKeys = []string{"patientId", "patientIds", "patient", "patients", "subject"}

var patientKeys = func() map[string]bool {
	m := map[string]bool{}
	for _, k := range PatientKeys {
		m[normKey(k)] = true
	}
	return m
}()

func normKey(k string) string {
	return strings.ToLower(strings.NewReplacer("_", "", "-", "").Replace(k))
}

// IsPatientKey reports whether a JSON key names a patient.
func IsPatientKey(k string) bool { return patientKeys[normKey(k)] }

// EventClassOf returns the class of a catalogued patient event type.
func EventClassOf(typ string) (EventClass, bool) {
	i := slices.IndexFunc(Events, func(c EventClass) bool { return c.Type == typ })
	if i < 0 {
		return EventClass{}, false
	}
	return Events[i], true
}

// ClassifyEvent reports whether an event of type typ with payload carries patient data: its type
// is classified, or its payload names a patient. It returns the Subject to decide on, without
// its organization: the patients the payload names and what reading it needs.
func ClassifyEvent(typ string, payload json.RawMessage) (Subject, bool) {
	c, typed := EventClassOf(typ)
	n := Patients(payload)
	s := Subject{Patients: n.IDs, Unidentified: n.Unidentified}
	switch {
	case typed:
		s.Need = c.Need
	case n.Named:
		s.Need = FreeForm.Need
	default:
		return Subject{}, false
	}
	return s, true
}

// keptFields returns the payload fields of typ that a redacted payload keeps: its class's Keep, or for
// a type without a class its catalogue fields (none for an uncatalogued type).
func keptFields(typ string) []string {
	if c, ok := EventClassOf(typ); ok {
		return c.Keep
	}
	et, _ := events.Lookup(typ)
	out := make([]string, 0, len(et.Payload))
	for _, f := range et.Payload {
		out = append(out, f.Name)
	}
	return out
}

// RedactPayload returns payload without patient data: only the fields typ keeps (EventClass.Keep,
// or the catalogue fields of a type without a class) whose values name no patient. An
// uncatalogued type keeps nothing ({}).
func RedactPayload(typ string, payload json.RawMessage) json.RawMessage {
	var fields map[string]json.RawMessage
	if json.Unmarshal(payload, &fields) != nil {
		return json.RawMessage(`{}`)
	}
	kept := map[string]json.RawMessage{}
	for _, name := range keptFields(typ) {
		raw, ok := fields[name]
		if !ok || IsPatientKey(name) {
			continue
		}
		if Patients(raw).Named {
			continue
		}
		kept[name] = raw
	}
	out, err := json.Marshal(kept)
	if err != nil {
		return json.RawMessage(`{}`)
	}
	return out
}

// Naming is what JSON values say about patients.
type Naming struct {
	IDs   []string // the patients they identify (pat_…), deduplicated
	Named bool     // a patient key occurs at all
	// Unidentified: some patient key's value identifies no patient (a name, a number, an object
	// without id or reference), so who it is about cannot be checked.
	Unidentified bool
}

// Patients returns what raws say about patients: the ids under PatientKeys at any depth.
func Patients(raws ...json.RawMessage) Naming {
	w := walker{}
	for _, raw := range raws {
		if !mayNamePatient(raw) {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v any
		if dec.Decode(&v) == nil {
			w.walk(v)
		}
	}
	return w.Naming
}

// mayNamePatient is a cheap pre-check: a value naming a patient contains "patient" or "subject"
// in some letter case, or an escape that may spell one. Most payloads (deployment changes,
// workflow ends) are skipped unparsed.
func mayNamePatient(raw json.RawMessage) bool {
	for i := 0; i+7 <= len(raw); i++ {
		if raw[i] == '\\' {
			return true
		}
		switch raw[i] | 0x20 { // ASCII lower case
		case 'p':
			if bytes.EqualFold(raw[i:i+7], []byte("patient")) {
				return true
			}
		case 's':
			if bytes.EqualFold(raw[i:i+7], []byte("subject")) {
				return true
			}
		}
	}
	return false
}

type walker struct{ Naming }

func (w *walker) walk(v any) {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			if IsPatientKey(k) {
				w.Named = true
				if !w.collect(x) {
					w.Unidentified = true
				}
			}
			w.walk(x)
		}
	case []any:
		for _, x := range t {
			w.walk(x)
		}
	}
}

// collect records the ids a patient key's value gives, and reports whether every part of it
// identified a patient.
func (w *walker) collect(v any) bool {
	switch t := v.(type) {
	case string:
		return w.add(t)
	case []any:
		all := true
		for _, x := range t {
			all = w.collect(x) && all
		}
		return all
	case map[string]any:
		for _, k := range []string{"id", "reference"} {
			if s, ok := t[k].(string); ok {
				return w.add(s)
			}
		}
	}
	return false
}

func (w *walker) add(s string) bool {
	id := PatientID(s)
	if id == "" {
		return false
	}
	if !slices.Contains(w.IDs, id) {
		w.IDs = append(w.IDs, id)
	}
	return true
}

// PatientID returns the carehub id a patient reference gives: "pat_…", its FHIR form "pat-…", or
// either behind "Patient/". Anything else is returned trimmed, as an id no patient has.
func PatientID(ref string) string {
	ref = strings.TrimSpace(ref)
	ref = strings.TrimPrefix(ref, "Patient/")
	if rest, ok := strings.CutPrefix(ref, "pat-"); ok {
		return "pat_" + rest
	}
	return ref
}
