// Package fhir is carehub's FHIR R4 REST interface at /fhir/R4 (docs/FHIR.md): Patient,
// Observation, Encounter and RiskAssessment behind the same keys, scopes, tenancy, test mode and
// audit as every other route.
//
//	GET  /fhir/R4/metadata                     the CapabilityStatement (no credential needed)
//	GET  /fhir/R4/{type}?…                     search: a searchset Bundle with total and next links
//	GET  /fhir/R4/{type}/{id}                  read
//	GET  /fhir/R4/{type}/{id}/_history[/{v}]   history and vread
//	POST /fhir/R4/Patient                      create (If-None-Exist: conditional create)
//	PUT  /fhir/R4/Patient/{id}                 update (a new version)
//	POST /fhir/R4/Observation                  create, through observation intake (as POST /v1/observations)
//	POST /fhir/R4                              batch and transaction Bundles
//
// Every error is an OperationOutcome naming the element in issue.expression where there is one.
// Ids are FHIR ids: carehub's with the prefix's '_' as '-' (storage/ids.FHIR); input takes both.
//
// Files: fhir.go (routes, formats, writing), search.go (search parameters), bundle.go (batch and
// transaction), outcome.go (OperationOutcome), capability.go (the CapabilityStatement).
package fhir
