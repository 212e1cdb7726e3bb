package patients

// The FHIR R4 resource types of the generic store (resources.go): which are served, which are
// patient data, the id prefix each gets and which elements their common search parameters read.

import "slices"

// typedTypes are served by typed tables, not the generic store. Encounter is both: the typed
// table holds what carehub's integrations write, the generic store what the FHIR base writes.
var typedTypes = []string{"Patient", "Observation", "RiskAssessment"}

// notStored are R4 resource types that are not records: a Bundle posted to the base is a batch
// or transaction, an OperationOutcome or Parameters is a message, a CapabilityStatement is
// served at /metadata.
var notStored = []string{"Bundle", "OperationOutcome", "Parameters", "CapabilityStatement"}

// r4Types are the resource types of FHIR R4 (4.0.1).
var r4Types = []string{"Account", "ActivityDefinition", "AdverseEvent", "AllergyIntolerance", "Appointment",
	"AppointmentResponse", "AuditEvent", "Basic", "Binary", "BiologicallyDerivedProduct", "BodyStructure", "Bundle",
	"CapabilityStatement", "CarePlan", "CareTeam", "CatalogEntry", "ChargeItem", "ChargeItemDefinition", "Claim",
	"ClaimResponse", "ClinicalImpression", "CodeSystem", "Communication", "CommunicationRequest", "CompartmentDefinition",
	"Composition", "ConceptMap", "Condition", "Consent", "Contract", "Coverage", "CoverageEligibilityRequest",
	"CoverageEligibilityResponse", "DetectedIssue", "Device", "DeviceDefinition", "DeviceMetric", "DeviceRequest",
	"DeviceUseStatement", "DiagnosticReport", "DocumentManifest", "DocumentReference", "EffectEvidenceSynthesis",
	"Encounter", "Endpoint", "EnrollmentRequest", "EnrollmentResponse", "EpisodeOfCare", "EventDefinition", "Evidence",
	"EvidenceVariable", "ExampleScenario", "ExplanationOfBenefit", "FamilyMemberHistory", "Flag", "Goal",
	"GraphDefinition", "Group", "GuidanceResponse", "HealthcareService", "ImagingStudy", "Immunization",
	"ImmunizationEvaluation", "ImmunizationRecommendation", "ImplementationGuide", "InsurancePlan", "Invoice", "Library",
	"Linkage", "List", "Location", "Measure", "MeasureReport", "Media", "Medication", "MedicationAdministration",
	"MedicationDispense", "MedicationKnowledge", "MedicationRequest", "MedicationStatement", "MedicinalProduct",
	"MedicinalProductAuthorization", "MedicinalProductContraindication", "MedicinalProductIndication",
	"MedicinalProductIngredient", "MedicinalProductInteraction", "MedicinalProductManufactured",
	"MedicinalProductPackaged", "MedicinalProductPharmaceutical", "MedicinalProductUndesirableEffect",
	"MessageDefinition", "MessageHeader", "MolecularSequence", "NamingSystem", "NutritionOrder", "Observation",
	"ObservationDefinition", "OperationDefinition", "OperationOutcome", "Organization", "OrganizationAffiliation",
	"Parameters", "Patient", "PaymentNotice", "PaymentReconciliation", "Person", "PlanDefinition", "Practitioner",
	"PractitionerRole", "Procedure", "Provenance", "Questionnaire", "QuestionnaireResponse", "RelatedPerson",
	"RequestGroup", "ResearchDefinition", "ResearchElementDefinition", "ResearchStudy", "ResearchSubject",
	"RiskAssessment", "RiskEvidenceSynthesis", "Schedule", "SearchParameter", "ServiceRequest", "Slot", "Specimen",
	"SpecimenDefinition", "StructureDefinition", "StructureMap", "Subscription", "Substance", "SubstanceNucleicAcid",
	"SubstancePolymer", "SubstanceProtein", "SubstanceReferenceInformation", "SubstanceSourceMaterial",
	"SubstanceSpecification", "SupplyDelivery", "SupplyRequest", "Task", "TerminologyCapabilities", "TestReport",
	"TestScript", "ValueSet", "VerificationResult", "VisionPrescription"}

// directoryTypes are not patient data: who and where care is given (Organization, Practitioner,
// Location …), what is given (Medication, Substance …) and the knowledge and conformance
// artifacts. Any credential of the organization reads them; they have no patient, and no read of
// them is audited as PHI. Every other type is patient data, whether or not a resource names its
// patient: reads need read:patients, as Patient's do.
var directoryTypes = []string{"Organization", "OrganizationAffiliation", "Practitioner", "PractitionerRole", "Location",
	"HealthcareService", "Endpoint", "Medication", "MedicationKnowledge", "Substance", "SubstanceNucleicAcid",
	"SubstancePolymer", "SubstanceProtein", "SubstanceReferenceInformation", "SubstanceSourceMaterial",
	"SubstanceSpecification", "MedicinalProduct", "MedicinalProductAuthorization", "MedicinalProductContraindication",
	"MedicinalProductIndication", "MedicinalProductIngredient", "MedicinalProductInteraction",
	"MedicinalProductManufactured", "MedicinalProductPackaged", "MedicinalProductPharmaceutical",
	"MedicinalProductUndesirableEffect", "DeviceDefinition", "InsurancePlan", "ObservationDefinition",
	"SpecimenDefinition", "ActivityDefinition", "PlanDefinition", "Questionnaire", "Library", "Measure", "CodeSystem",
	"ValueSet", "ConceptMap", "NamingSystem", "StructureDefinition", "StructureMap", "SearchParameter",
	"OperationDefinition", "CompartmentDefinition", "ImplementationGuide", "GraphDefinition", "MessageDefinition",
	"EventDefinition", "ChargeItemDefinition", "Evidence", "EvidenceVariable", "EffectEvidenceSynthesis",
	"RiskEvidenceSynthesis", "ResearchDefinition", "ResearchElementDefinition", "ExampleScenario",
	"TerminologyCapabilities", "TestScript", "CatalogEntry", "Schedule", "Slot", "ResearchStudy", "Subscription"}

// idPrefixes name what an id is for the types a Synthea record carries (DECISIONS §1: ids say
// what they name); other types' ids start with res_. Organization is not org_: that is the tenant.
var idPrefixes = map[string]string{"Encounter": "enc_", "Condition": "cond_", "Procedure": "proc_",
	"MedicationRequest": "medrq_", "MedicationAdministration": "medad_", "MedicationStatement": "medst_",
	"MedicationDispense": "medds_", "Medication": "med_", "Immunization": "imm_", "DiagnosticReport": "dxr_",
	"DocumentReference": "doc_", "Claim": "clm_", "ExplanationOfBenefit": "eob_", "CarePlan": "cpl_", "CareTeam": "ctm_",
	"Goal": "goal_", "AllergyIntolerance": "alg_", "Device": "dev_", "ImagingStudy": "img_", "Provenance": "prov_",
	"SupplyDelivery": "sup_", "Organization": "hco_", "Practitioner": "prac_", "PractitionerRole": "prole_",
	"Location": "loc_", "Coverage": "cov_", "ServiceRequest": "srq_", "Specimen": "spec_"}

// patientElements are the top-level elements that name a resource's patient, in order; the first
// holding a Patient reference decides. Provenance names it among its targets.
var patientElements = []string{"patient", "subject", "beneficiary", "target"}

// codeElements are the elements the code parameter reads where they are not "code" (FHIR's own
// parameter of that meaning has another name: Immunization vaccine-code, Encounter type …).
var codeElements = map[string][]string{"MedicationRequest": {"medicationCodeableConcept"},
	"MedicationAdministration": {"medicationCodeableConcept"}, "MedicationStatement": {"medicationCodeableConcept"},
	"MedicationDispense": {"medicationCodeableConcept"}, "Immunization": {"vaccineCode"}, "Encounter": {"type"},
	"DocumentReference": {"type"}, "Device": {"type"}, "Claim": {"type"}, "ExplanationOfBenefit": {"type"},
	"Goal": {"description"}, "CareTeam": {"category"}, "ImagingStudy": {"procedureCode"}, "SupplyDelivery": {"type"},
	"Coverage": {"type"}, "Provenance": {"activity"}}

// dateElements are the elements the date parameter reads: the first present, of any type
// (date, dateTime, instant, Period).
var dateElements = []string{"effectiveDateTime", "effectivePeriod", "effectiveInstant", "occurrenceDateTime",
	"occurrencePeriod", "performedDateTime", "performedPeriod", "onsetDateTime", "onsetPeriod", "period", "authoredOn",
	"recordedDate", "recorded", "started", "issued", "created", "date", "billablePeriod"}

// statusElements are the elements the status parameter reads: a code, or a CodeableConcept's codes.
var statusElements = []string{"status", "clinicalStatus", "verificationStatus", "lifecycleStatus"}

// GenericType reports whether t is served by the generic store.
func GenericType(t string) bool {
	return slices.Contains(r4Types, t) && !slices.Contains(typedTypes, t) && !slices.Contains(notStored, t)
}

// GenericTypes are the types of the generic store, in R4's order.
func GenericTypes() []string {
	var out []string
	for _, t := range r4Types {
		if GenericType(t) {
			out = append(out, t)
		}
	}
	return out
}

// PatientData reports whether resources of type t are patient data (PHI): read:patients to read,
// audited with their patient. Patient, Observation and RiskAssessment are; the directory types
// are not.
func PatientData(t string) bool { return !slices.Contains(directoryTypes, t) }

func idPrefix(t string) string {
	if p, ok := idPrefixes[t]; ok {
		return p
	}
	return "res_"
}
