// Package fhir is carehub's FHIR R4 REST interface at /fhir/R4 (docs/FHIR.md): Patient,
// Observation, Encounter and RiskAssessment behind the same keys, scopes, tenancy, test mode and
// audit as every other route.
//
//	GET  /fhir/R4/metadata                     the CapabilityStatement (no credential needed)
//	GET  /fhir/R4/{type}?…                     search: a searchset Bundle with total and next links
//	POST /fhir/R4/{type}/_search               the same search, parameters form-encoded
//	GET  /fhir/R4/{type}/{id}                  read
//	GET  /fhir/R4/{type}/{id}/_history[/{v}]   history and vread
//	POST /fhir/R4/Patient                      create (If-None-Exist: conditional create)
//	PUT  /fhir/R4/Patient/{id}                 update (a new version)
//	POST /fhir/R4/Observation                  create, through observation intake (as POST /v1/observations)
//	POST /fhir/R4[/]                           batch and transaction Bundles
//
// A create, alone or in a Bundle, is a new resource with an id carehub assigns: the body's id and
// meta.versionId and lastUpdated are ignored, as FHIR says, so that no create is answered 201 and
// left unstored. Every error is an OperationOutcome naming the element in issue.expression where
// there is one, the router's own (no route, another method) included (api/server answers those
// with WriteNoRoute). Ids are FHIR ids: carehub's with the prefix's '_' as '-' (storage/ids.FHIR);
// input takes both.
//
// Files: fhir.go (routes, formats, reads, update), create.go (create), search.go (search
// parameters), bundle.go (batch and transaction), outcome.go (OperationOutcome and routing
// refusals), capability.go (the CapabilityStatement).
package fhir
