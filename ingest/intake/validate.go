package intake

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	jsonv1 "github.com/go-json-experiment/json/v1"

	"carehub/kernel/clinical"
	"carehub/kernel/egress"
	"carehub/kernel/ids"
	"carehub/kernel/jsonwire"
	"carehub/schemas/kafka/observation"
)

// Codes of per-entry errors ({index, code, message}); docs/errors and the OpenAPI document list
// them with their meaning.
const (
	CodeInvalidJSON      = "INVALID_JSON"      // the entry (NDJSON line, bundle entry) is not a JSON object carehub can store
	CodeEntryTooLarge    = "ENTRY_TOO_LARGE"   // one observation larger than MaxEntryBytes
	CodeInvalidEntry     = "INVALID_ENTRY"     // a bundle entry without a resource, or whose request is not POST Observation
	CodeInvalidResource  = "INVALID_RESOURCE"  // not an Observation, or an element of the wrong type
	CodeInvalidID        = "INVALID_ID"        // Observation.id is not a FHIR id
	CodeInvalidStatus    = "INVALID_STATUS"    // status missing or outside the observation-status value set
	CodeMissingCode      = "MISSING_CODE"      // no code.coding, or a vital sign without a LOINC coding
	CodeInvalidSubject   = "INVALID_SUBJECT"   // subject.reference is not Patient/<id>
	CodeUnknownPatient   = "UNKNOWN_PATIENT"   // no such patient visible to the caller (the entry form of NOT_FOUND)
	CodeInvalidEffective = "INVALID_EFFECTIVE" // effective[x] missing, not a FHIR dateTime/instant/Period, or absurd
	CodeInvalidValue     = "INVALID_VALUE"     // value[x], component or dataAbsentReason missing or wrong: no number, a unit that does not fit the code, implausible
)

// EntryError is why one entry of a request was not accepted. Index is the entry's position: 0
// for a single Observation, the index in Bundle.entry, or the zero-based line number of an
// NDJSON stream (blank lines count).
type EntryError struct {
	Index   int    `json:"index"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// MaxEntryBytes bounds one observation's JSON. Device observations are well under 1 KiB; the
// bound keeps a record far below Kafka's message size limit.
const MaxEntryBytes = 64 << 10

// LOINCSystem is the coding system of LOINC codes.
const LOINCSystem = "http://loinc.org"

// observationCategorySystem and vitalSigns mark an Observation of the FHIR vital-signs category,
// which must carry a LOINC code.
const (
	observationCategorySystem = "http://terminology.hl7.org/CodeSystem/observation-category"
	vitalSignsCategory        = "vital-signs"
)

// statuses is FHIR R4's observation-status value set (required binding).
var statuses = map[string]bool{
	"registered": true, "preliminary": true, "final": true, "amended": true,
	"corrected": true, "cancelled": true, "entered-in-error": true, "unknown": true,
}

// The FHIR elements validation reads; every other element passes through untouched.
type fhirObservation struct {
	ResourceType string          `json:"resourceType"`
	ID           *string         `json:"id"`
	Identifier   json.RawMessage `json:"identifier"`
	Status       *string         `json:"status"`
	Category     []concept       `json:"category"`
	Code         *concept        `json:"code"`
	Subject      *reference      `json:"subject"`
	Device       *reference      `json:"device"`
	effective
	value
	Component []json.RawMessage `json:"component"`
}

type concept struct {
	Coding []coding `json:"coding"`
	Text   string   `json:"text"`
}

type coding struct {
	System string `json:"system"`
	Code   string `json:"code"`
}

type reference struct {
	Reference string `json:"reference"`
	Display   string `json:"display"`
}

type quantity struct {
	Value  *float64 `json:"value"`
	Unit   *string  `json:"unit"`
	System *string  `json:"system"`
	Code   *string  `json:"code"`
}

// limits are the time bounds of effectiveDateTime.
type limits struct {
	now       time.Time
	maxFuture time.Duration
}

// earliestEffective is the earliest effectiveDateTime accepted: older is a device clock or
// entry error, not a reading.
var earliestEffective = time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC)

// parseObservation validates one Observation (in a fixed order; the first failure is
// reported) and returns it as a message without the id, organization and time intake adds.
// raw is kept, not copied: it is stored as sent.
func parseObservation(raw []byte, lim limits) (observation.Message, *EntryError) {
	p, e := parseEntry(raw, lim)
	return p.msg, e
}

// parsed is one valid Observation: its message, and the vital signs among its components,
// stored as observations of their own (see parts.go).
type parsed struct {
	msg   observation.Message
	parts []part
}

// Check validates one Observation as Submit does, short of its patient lookup: the FHIR base
// checks a transaction's observations before it writes any of the transaction. nil: valid.
func (in *Intake) Check(raw []byte) *EntryError {
	_, e := parseEntry(raw, limits{now: time.Now(), maxFuture: in.cfg.MaxFuture})
	return e
}

func parseEntry(raw []byte, lim limits) (parsed, *EntryError) {
	if len(raw) > MaxEntryBytes {
		return parsed{}, entryErr(CodeEntryTooLarge, "the observation is %d bytes; at most %d are accepted", len(raw), MaxEntryBytes)
	}
	if msg := unstorableJSON(raw); msg != "" {
		return parsed{}, entryErr(CodeInvalidJSON, "%s", msg)
	}
	var o fhirObservation
	if err := decodeObservation(raw, &o); err != nil {
		return parsed{}, decodeError(err)
	}
	if o.ResourceType != "Observation" {
		return parsed{}, entryErr(CodeInvalidResource, "resourceType must be Observation, not %q", truncate(o.ResourceType))
	}
	var clientID string
	if o.ID != nil {
		if !validFHIRID(*o.ID) {
			return parsed{}, entryErr(CodeInvalidID, "id must be a FHIR id: 1 to 64 of A-Z a-z 0-9 - . _")
		}
		clientID = *o.ID
	}
	if len(o.Identifier) > 0 && o.Identifier[0] != '[' && string(o.Identifier) != "null" {
		return parsed{}, entryErr(CodeInvalidResource, "identifier must be an array")
	}
	if o.Status == nil || *o.Status == "" {
		return parsed{}, entryErr(CodeInvalidStatus, "status is required")
	}
	if !statuses[*o.Status] {
		return parsed{}, entryErr(CodeInvalidStatus, "status %q is not in the observation-status value set (registered, preliminary, final, amended, corrected, cancelled, entered-in-error, unknown)", truncate(*o.Status))
	}
	code, loinc, e := codes(&o)
	if e != nil {
		return parsed{}, e
	}
	patientID, e := subjectPatient(o.Subject)
	if e != nil {
		return parsed{}, e
	}
	effective, e := o.effective.at(lim)
	if e != nil {
		return parsed{}, e
	}
	parts, e := components(o.Component)
	if e != nil {
		return parsed{}, e
	}
	v, e := o.value.read(loinc, "", len(o.Component) > 0)
	if e != nil {
		return parsed{}, e
	}
	var device string
	if o.Device != nil {
		device = truncate(strings.TrimSpace(o.Device.Display))
	}
	return parsed{msg: observation.Message{
		PatientID: patientID, Observation: raw, Status: *o.Status, LOINC: loinc, Code: code,
		Value: v.value, NoValue: !v.has, Unit: truncate(v.unit), EffectiveAt: effective, DeviceType: device, ClientID: clientID,
	}, parts: parts}, nil
}

// codes returns the code events carry (LOINC if any, else the first coding's) and the LOINC
// code (the first one carehub scores, else the first). A vital-signs Observation, or one coded with a vital sign carehub scores, needs LOINC.
func codes(o *fhirObservation) (code, loinc string, _ *EntryError) {
	if o.Code == nil || len(o.Code.Coding) == 0 {
		return "", "", entryErr(CodeMissingCode, "code.coding must hold at least one coding")
	}
	for _, c := range o.Code.Coding {
		if c.Code == "" {
			continue
		}
		if code == "" {
			code = c.Code
		}
		if c.System == LOINCSystem && (loinc == "" || preferred(c.Code) && !preferred(loinc)) {
			loinc = c.Code
		}
	}
	if code == "" {
		return "", "", entryErr(CodeMissingCode, "code.coding has no coding with a code")
	}
	if loinc == "" && isVitalSign(o) {
		return "", "", entryErr(CodeMissingCode, "a vital-signs observation needs a LOINC coding (system %s)", LOINCSystem)
	}
	if loinc != "" {
		code = loinc
	}
	return truncate(code), truncate(loinc), nil
}

// preferred reports whether a LOINC code is one carehub scores: of several LOINC codings (HL7's
// SpO2 example codes 2708-6 and 59408-5), that one is stored, as NEWS2 reads it.
func preferred(loinc string) bool {
	_, ok := clinical.VitalByCode(loinc)
	return ok
}

func isVitalSign(o *fhirObservation) bool {
	for _, cat := range o.Category {
		for _, c := range cat.Coding {
			if c.Code == vitalSignsCategory && (c.System == observationCategorySystem || c.System == "") {
				return true
			}
		}
	}
	for _, c := range o.Code.Coding {
		if _, ok := clinical.VitalByCode(c.Code); ok && c.System != LOINCSystem {
			return true // a vital sign's code under another system: say which system is expected
		}
	}
	return false
}

func subjectPatient(s *reference) (string, *EntryError) {
	if s == nil || s.Reference == "" {
		return "", entryErr(CodeInvalidSubject, "subject.reference is required: Patient/<id>")
	}
	id, ok := strings.CutPrefix(s.Reference, "Patient/")
	if !ok || !validFHIRID(id) {
		return "", entryErr(CodeInvalidSubject, "subject.reference must be Patient/<id>, a patient of this organization")
	}
	return ids.FromFHIR(id), nil // Patient/pat-01k… (the FHIR form) names pat_01k…
}

// decodeError classifies a decoding failure: malformed JSON, or an element of the wrong type,
// reported under the code of the element.
func decodeError(err error) *EntryError {
	if te, ok := errors.AsType[*jsonv1.UnmarshalTypeError](err); ok {
		field := te.Field
		code := CodeInvalidResource
		switch {
		case strings.HasPrefix(field, "value"), strings.HasPrefix(field, "dataAbsentReason"), strings.HasPrefix(field, "component"):
			code = CodeInvalidValue
		case field == "status":
			code = CodeInvalidStatus
		case strings.HasPrefix(field, "code"):
			code = CodeMissingCode
		case strings.HasPrefix(field, "subject"):
			code = CodeInvalidSubject
		case strings.HasPrefix(field, "effective"):
			code = CodeInvalidEffective
		case field == "id":
			code = CodeInvalidID
		case field == "":
			return entryErr(CodeInvalidJSON, "the entry must be a JSON object")
		}
		return entryErr(code, "%s must be a JSON %s", field, jsonKind(te.Type.Kind().String()))
	}
	return entryErr(CodeInvalidJSON, "malformed JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "string"
	case "float64":
		return "number"
	case "slice":
		return "array"
	case "struct", "ptr", "map":
		return "object"
	}
	return goKind
}

// unstorableJSON finds what encoding/json accepts but Postgres refuses to store or to read back
// (its json operators): invalid UTF-8, the escape \u0000 and unpaired UTF-16 surrogate escapes.
// It returns "" when raw is storable.
func unstorableJSON(raw []byte) string {
	if !utf8.Valid(raw) {
		return "the entry is not valid UTF-8"
	}
	return jsonwire.UnstorableEscape(raw)
}

// validFHIRID reports whether s is a FHIR id, [A-Za-z0-9\-\.]{1,64}, also allowing '_', which
// carehub's own ids (pat_…, obs_…) contain.
func validFHIRID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return false
		}
	}
	return true
}

// truncate bounds client strings that are echoed in messages or stored as columns.
func truncate(s string) string { return egress.Clip(s, 200) }

func entryErr(code, format string, args ...any) *EntryError {
	return &EntryError{Code: code, Message: fmt.Sprintf(format, args...)}
}
