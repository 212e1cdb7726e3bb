// Package intake is device observation intake: the service behind POST /v1/observations.
// It validates FHIR R4 Observations (one, a Bundle of type batch or transaction, or an NDJSON
// stream), checks that each names a patient the caller may write for, and commits the valid
// ones to carehub.observations.v1 (key = patient id) in one Kafka transaction per request,
// answering only after the broker has acknowledged it. The observation writer
// (processors/observations) stores them.
//
// # Guarantees
//
//   - 202 means every accepted observation is durably in Kafka (acks=all, idempotent,
//     transactional producer) and will be stored; any other answer means none of the request
//     will be (the writer reads read-committed, an unanswered request's transaction aborts).
//   - A batch Bundle and an NDJSON stream are answered per entry: {accepted, rejected[{index,
//     code, message}], ids}. A transaction Bundle with any invalid entry is 422 and nothing is
//     produced. A request with nothing valid is 422 with the same fields as error details.
//   - NDJSON is read line by line with a bounded buffer and produced in chunks as it is read;
//     past MaxEntries lines (or MaxBodyBytes) the transaction aborts and the answer is 413.
//   - Retries are safe: an Observation.id makes the observation's id a function of (organization,
//     that id, the observation as sent), so however often the same observation is sent it is
//     stored once; an Idempotency-Key replays the first answer for 24 h (409 for another body, or
//     while the first is still running).
//   - Nothing acknowledged goes unstored: the writer stores an id once, so no two different
//     observations are given one id. Another observation sent under a client id already used
//     (HL7's example ids, a device's reused counter) is stored as an observation of its own, both
//     keeping the client id as an identifier (urn:carehub:client-id).
//   - Tenancy and test mode: an observation of another organization's patient, or of a real
//     patient under a test key, is rejected as UNKNOWN_PATIENT, exactly like a patient that does
//     not exist.
//   - Backpressure: past MaxLag records of writer lag (measured every LagInterval, cached),
//     requests are refused with 503 and Retry-After before anything is read.
//
// # Files
//
//	intake.go       Config, Intake: defaults, lifecycle (New, Run, Close), lag and limits
//	submit.go       Submit: one request from its media type to its answer, the request state
//	decode.go       reading the body: one JSON document or an NDJSON stream, within the limits
//	produce.go      valid entries to records (patients, ids) and the request's transaction (a publish.Transactional's)
//	validate.go     the FHIR Observation checks and the entry error codes
//	values.go       value[x], dataAbsentReason and effective[x]
//	ucum.go         UCUM by system+code: the vital signs' canonical units and conversions
//	parts.go        component: a panel's vital signs stored as observations of their own
//	patients.go     batched, cached patient lookups
//	idempotency.go  Idempotency-Key reservation, replay and expiry
//	backpressure.go the writer lag watch
//	metrics.go      Prometheus metrics
package intake
