// Package fhir is carehub's FHIR R4 REST interface at /fhir/R4 (docs/FHIR.md): Patient,
// Observation and RiskAssessment from their typed tables and every other R4 type from a generic
// store, behind the same keys, scopes, tenancy, test mode and audit as every other route.
//
//	GET  /fhir/R4/metadata                     the CapabilityStatement (no credential needed)
//	GET  /fhir/R4/{type}?…                     search: a searchset Bundle with total and next links
//	POST /fhir/R4/{type}/_search               the same search, parameters form-encoded
//	GET  /fhir/R4/{type}/{id}                  read
//	GET  /fhir/R4/{type}/{id}/_history[/{v}]   history and vread
//	GET  /fhir/R4/{type}/_history, /_history    type and system history
//	POST /fhir/R4/Patient[?search]             create (If-None-Exist or a query string: conditional create)
//	PUT  /fhir/R4/Patient/{id}                 update (a new version; If-Match: 412 on a stale one)
//	DELETE /fhir/R4/Patient/{id}               delete (kept in history; reads then 410)
//	POST /fhir/R4/Observation                  create, through observation intake (as POST /v1/observations)
//	POST /fhir/R4[/]                           batch and transaction Bundles
//	POST, PUT /fhir/R4/{type}[/{id}]           every other R4 type: the generic store (update as create)
//	GET  /fhir/R4/Patient/{id}/$everything     a patient's whole record
//
// A create, alone or in a Bundle, is a new resource with an id carehub assigns: the body's id and
// meta.versionId and lastUpdated are ignored, as FHIR says, so that no create is answered 201 and
// left unstored. Every error is an OperationOutcome naming the element in issue.expression where
// there is one, the router's own (no route, another method) included (api/server answers those
// with WriteNoRoute). Ids are FHIR ids: carehub's with the prefix's '_' as '-' (kernel/ids.FHIR);
// input takes both.
//
// Files: fhir.go (routes, formats, reads, update), create.go (create), search.go (search
// parameters), search_more.go (_summary, _elements, _total, _revinclude, chains, keyset paging,
// conditional create by any search, Retry-After), bundle.go (batch and transaction), outcome.go
// (OperationOutcome and routing refusals), capability.go (the CapabilityStatement), versioning.go (ETag, Last-Modified,
// If-Match, conditional read, delete, 410), history.go (history Bundles at every level),
// resources.go (the types beyond the typed four), bundle_tx.go (transactions of every type,
// references resolved), everything.go (Patient/$everything).
package fhir
