package audit

import (
	"encoding/json"
	"errors"
	"strconv"
	"time"
	"unicode/utf8"

	"carehub/kernel/jsonwire"
	"carehub/storage"
)

// Every API call is audited, so every call's record is encoded once by the publisher and decoded
// once by the writer. Both work without reflection: encoding/json's were 3 % of a node's CPU under
// a load of single publishEvent calls. FuzzCodec holds them to encoding/json.

// encode returns rec as it travels on the audit topic: the JSON json.Marshal writes of a
// storage.AuditRecord, without reflection, <, > and & as themselves (the two decode alike).
func encode(rec storage.AuditRecord) ([]byte, error) {
	if !validUTF8(rec) || rec.Time.Year() < 0 || rec.Time.Year() > 9999 {
		return json.Marshal(rec) // what encoding/json makes of them, or its error
	}
	b := make([]byte, 0, 320+len(rec.UserAgent)+40*(len(rec.ResourceIDs)+len(rec.PatientIDs)))
	b = append(b, `{"id":`...)
	b = jsonwire.AppendString(b, rec.ID)
	b = append(b, `,"time":"`...)
	b = rec.Time.AppendFormat(b, time.RFC3339Nano) // time.Time.MarshalJSON's layout
	b = append(b, `","orgId":`...)
	b = jsonwire.AppendString(b, rec.OrgID)
	b = append(b, `,"keyId":`...)
	b = jsonwire.AppendString(b, rec.KeyID)
	b = append(b, `,"mode":`...)
	b = jsonwire.AppendString(b, rec.Mode)
	b = append(b, `,"clientIp":`...)
	b = jsonwire.AppendString(b, rec.ClientIP)
	b = append(b, `,"userAgent":`...)
	b = jsonwire.AppendString(b, rec.UserAgent)
	b = append(b, `,"operation":`...)
	b = jsonwire.AppendString(b, rec.Operation)
	b = append(b, `,"resourceIds":`...)
	b = appendStrings(b, rec.ResourceIDs)
	b = append(b, `,"patientIds":`...)
	b = appendStrings(b, rec.PatientIDs)
	b = append(b, `,"outcome":`...)
	b = jsonwire.AppendString(b, rec.Outcome)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(rec.Status), 10)
	b = append(b, `,"latencyMs":`...)
	b = strconv.AppendInt(b, int64(rec.LatencyMs), 10)
	b = append(b, `,"truncated":`...)
	b = strconv.AppendBool(b, rec.Truncated)
	b = append(b, `,"patientIdsOmitted":`...)
	b = strconv.AppendInt(b, int64(rec.PatientIDsOmitted), 10)
	b = append(b, `,"resourceIdsOmitted":`...)
	b = strconv.AppendInt(b, int64(rec.ResourceIDsOmitted), 10)
	if rec.AuthFailure != "" {
		b = append(b, `,"authFailure":`...)
		b = jsonwire.AppendString(b, rec.AuthFailure)
	}
	if rec.Credential != "" {
		b = append(b, `,"credential":`...)
		b = jsonwire.AppendString(b, rec.Credential)
	}
	return append(b, '}'), nil
}

// validUTF8 reports whether every string of rec is valid UTF-8, which jsonwire.AppendString
// expects. A client's User-Agent may not be.
func validUTF8(rec storage.AuditRecord) bool {
	for _, s := range [...]string{rec.ID, rec.OrgID, rec.KeyID, rec.Mode, rec.ClientIP, rec.UserAgent, rec.Operation, rec.Outcome, rec.AuthFailure, rec.Credential} {
		if !utf8.ValidString(s) {
			return false
		}
	}
	for _, ids := range [...][]string{rec.ResourceIDs, rec.PatientIDs} {
		for _, s := range ids {
			if !utf8.ValidString(s) {
				return false
			}
		}
	}
	return true
}

// appendStrings appends ss as a JSON array of strings; nil is null, as in encoding/json.
func appendStrings(b []byte, ss []string) []byte {
	if ss == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonwire.AppendString(b, s)
	}
	return append(b, ']')
}

// decode returns the audit record of a message, as json.Unmarshal into a storage.AuditRecord
// would (an error where it has one). An invalid message can never be stored.
func decode(value []byte) (storage.AuditRecord, error) {
	var a storage.AuditRecord
	if !jsonwire.Valid(value) {
		return a, errors.New("audit message: not valid JSON")
	}
	if err := jsonwire.Members(value, func(key, v []byte) error { return setMember(&a, key, v) }); err != nil {
		return a, err
	}
	if a.ID == "" || a.Operation == "" || a.Time.IsZero() {
		return a, errors.New("audit message without id, operation or time")
	}
	return a, nil
}

// recordKeys are storage.AuditRecord's JSON names, for the case-insensitive match encoding/json
// makes when no key matches exactly.
var recordKeys = []string{"id", "time", "orgId", "keyId", "mode", "clientIp", "userAgent", "operation", "resourceIds", "patientIds",
	"outcome", "status", "latencyMs", "truncated", "patientIdsOmitted", "resourceIdsOmitted", "authFailure", "credential"}

func setMember(a *storage.AuditRecord, key, v []byte) error {
	switch string(key) {
	case "id":
		return jsonwire.String(v, &a.ID)
	case "time":
		return jsonwire.Time(v, &a.Time)
	case "orgId":
		return jsonwire.String(v, &a.OrgID)
	case "keyId":
		return jsonwire.String(v, &a.KeyID)
	case "mode":
		return jsonwire.String(v, &a.Mode)
	case "clientIp":
		return jsonwire.String(v, &a.ClientIP)
	case "userAgent":
		return jsonwire.String(v, &a.UserAgent)
	case "operation":
		return jsonwire.String(v, &a.Operation)
	case "resourceIds":
		return jsonwire.Strings(v, &a.ResourceIDs)
	case "patientIds":
		return jsonwire.Strings(v, &a.PatientIDs)
	case "outcome":
		return jsonwire.String(v, &a.Outcome)
	case "status":
		return jsonwire.Int(v, &a.Status)
	case "latencyMs":
		return jsonwire.Int(v, &a.LatencyMs)
	case "truncated":
		return jsonwire.Bool(v, &a.Truncated)
	case "patientIdsOmitted":
		return jsonwire.Int(v, &a.PatientIDsOmitted)
	case "resourceIdsOmitted":
		return jsonwire.Int(v, &a.ResourceIDsOmitted)
	case "authFailure":
		return jsonwire.String(v, &a.AuthFailure)
	case "credential":
		return jsonwire.String(v, &a.Credential)
	}
	if name := jsonwire.Fold(key, recordKeys); name != "" {
		return setMember(a, []byte(name), v)
	}
	return nil // not a member of the record: ignored, as encoding/json does
}
