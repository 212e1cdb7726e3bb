package demo

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"carehub/kernel/ids"
	"carehub/models"
)

type orgSpec struct {
	slug, name, typ, plan string
	fhirBase              string // "" stores NULL
	hipaa                 bool
	members               int
	projects              []string
	patients              int
	state                 string
	areaCodes             []string
	cities                []city
}

type city struct{ name, zip string }

// orgSpecs lists the organizations; the first is the main demo tenant. Together they cover every
// organization type and plan.
var orgSpecs = []orgSpec{
	{
		slug: DemoOrgSlug, name: "Demo Health", typ: "health_system", plan: "enterprise",
		fhirBase: "https://fhir.demo-health.example.org/r4", hipaa: true, members: 48,
		projects: []string{SepsisProjectName, RPMProjectName, "Radiology AI Pilot"},
		patients: 160, state: "MA", areaCodes: []string{"508", "781", "978"},
		cities: []city{{"Worcester", "01608"}, {"Framingham", "01702"}, {"Lowell", "01852"},
			{"Brockton", "02301"}, {"Quincy", "02169"}, {"Waltham", "02451"}},
	},
	{
		slug: "northwind-health", name: "Northwind Health", typ: "health_system", plan: "enterprise",
		fhirBase: "https://fhir.northwind-health.example.org/r4", hipaa: true, members: 212,
		projects: []string{"Inpatient Deterioration", "ICU Sepsis Bundle"},
		patients: 14, state: "MN", areaCodes: []string{"218", "507", "320"},
		cities: []city{{"Duluth", "55802"}, {"Rochester", "55901"}, {"St. Cloud", "56301"}},
	},
	{
		slug: "lakeside-clinic", name: "Lakeside Clinic", typ: "clinic", plan: "growth",
		hipaa: true, members: 18, projects: []string{"Chronic Care Management"},
		patients: 8, state: "WI", areaCodes: []string{"608", "920"},
		cities: []city{{"Madison", "53703"}, {"Sheboygan", "53081"}},
	},
	{
		slug: "harbor-family-medicine", name: "Harbor Family Medicine", typ: "clinic", plan: "starter",
		hipaa: true, members: 6, projects: []string{"Hypertension Outreach"},
		patients: 5, state: "ME", areaCodes: []string{"207"},
		cities: []city{{"Portland", "04101"}, {"Bath", "04530"}},
	},
	{
		slug: "bluecrest-health-plan", name: "BlueCrest Health Plan", typ: "payer", plan: "enterprise",
		fhirBase: "https://api.bluecrest.example.com/fhir/r4", hipaa: true, members: 95,
		projects: []string{"Risk Adjustment Analytics", "Care Management Outreach"},
		patients: 6, state: "OH", areaCodes: []string{"614", "937"},
		cities: []city{{"Columbus", "43215"}, {"Dayton", "45402"}},
	},
	{
		slug: "meridian-mutual", name: "Meridian Mutual Insurance", typ: "payer", plan: "growth",
		fhirBase: "https://fhir.meridian-mutual.example.com/r4", hipaa: true, members: 34,
		projects: []string{"Prior Authorization Automation"},
		patients: 4, state: "TX", areaCodes: []string{"512", "254"},
		cities: []city{{"Austin", "78701"}, {"Waco", "76701"}},
	},
	{
		slug: "vitalsignal-labs", name: "VitalSignal Labs", typ: "developer", plan: "growth",
		hipaa: true, members: 22, projects: []string{"Early Warning Models", "Agent Sandbox"},
		patients: 3, state: "CA", areaCodes: []string{"510"},
		cities: []city{{"Oakland", "94612"}},
	},
	{
		slug: "cardiolytics", name: "Cardiolytics", typ: "developer", plan: "starter",
		members: 9, projects: []string{"ECG Model Development"},
		patients: 2, state: "CO", areaCodes: []string{"303"},
		cities: []city{{"Boulder", "80302"}},
	},
	{
		slug: "great-lakes-research", name: "Great Lakes Clinical Research Institute", typ: "research", plan: "growth",
		fhirBase: "https://fhir.greatlakes-research.example.org/r4", hipaa: true, members: 41,
		projects: []string{"Sepsis Cohort Study"},
		patients: 6, state: "MI", areaCodes: []string{"734"},
		cities: []city{{"Ann Arbor", "48104"}, {"Ypsilanti", "48197"}},
	},
	{
		slug: "pacific-translational", name: "Pacific Translational Research Consortium", typ: "research", plan: "starter",
		members: 12, projects: []string{"Remote Monitoring Outcomes Trial"},
		patients: 2, state: "OR", areaCodes: []string{"503", "541"},
		cities: []city{{"Portland", "97201"}, {"Eugene", "97401"}},
	},
}

type publisherSpec struct {
	name, contact, domain string
	org                   string // org slug, "" for none
	verified              bool
}

func (p publisherSpec) email() string { return p.contact + "@" + p.domain }

var publisherSpecs = []publisherSpec{
	{"VitalSignal Labs", "marketplace", "vitalsignal.example.com", "vitalsignal-labs", true},
	{"Cardiolytics", "partners", "cardiolytics.example.com", "cardiolytics", true},
	{"Great Lakes Clinical Research Institute", "informatics", "greatlakes-research.example.org", "great-lakes-research", true},
	{"Northwind Health Innovation", "innovation", "northwind-health.example.org", "northwind-health", true},
	{"OpenFHIR Collective", "maintainers", "openfhir.example.org", "", true},
	{"Radiant Imaging AI", "sales", "radiant-imaging.example.com", "", true},
	{"Scribewell", "hello", "scribewell.example.com", "", true},
	{"Raman Clinical Informatics", "priya.raman", "raman-informatics.example.com", "", false},
	{"Helix Data Partners", "data", "helixdata.example.com", "", false},
	{"CarePath Analytics", "info", "carepath.example.com", "", false},
}

type pricing struct {
	typ                string
	costPerRequest     *float64
	monthlyFee, annual *float64
	freeTierLimit      *int
}

func ptr[T any](v T) *T { return &v }

func free() pricing { return pricing{typ: "FREE"} }

func usage(cost float64, freeTier int) pricing {
	p := pricing{typ: "USAGE_BASED", costPerRequest: &cost}
	if freeTier > 0 {
		p.freeTierLimit = &freeTier
	}
	return p
}

func subscription(monthly, annual float64) pricing {
	return pricing{typ: "SUBSCRIPTION", monthlyFee: &monthly, annual: &annual}
}

func enterprise(annual float64) pricing { return pricing{typ: "ENTERPRISE", annual: &annual} }

// Badges. "Verified Publisher" (a verified publisher's listed asset) and "Top Rated" (rating 4.7 or
// more over 1000 downloads) are derived in catalogue; the others are declared per asset.
const (
	badgeHIPAA    = "HIPAA"
	badgeFDA      = "FDA 510(k)"
	badgeSOC2     = "SOC 2"
	badgeHITRUST  = "HITRUST"
	badgeONC      = "ONC Certified"
	badgeVerified = "Verified Publisher"
	badgeTop      = "Top Rated"
)

type assetSpec struct {
	name, typ, category, version, publisher string
	description                             string
	price                                   pricing
	fhir                                    []string
	badges                                  []string
	rating                                  float64 // 0 stores NULL
	downloads                               int
	status                                  string
	runtime                                 string
	model                                   []byte // an ONNX file the version carries (runtime onnx)
	modelSignature                          string // its signature, as processors/marketplace records it
	reviewNotes                             string
}

// FHIR resource type names (the spec's FHIRResourceType values).
const (
	fPatient    = "Patient"
	fObs        = "Observation"
	fReport     = "DiagnosticReport"
	fEncounter  = "Encounter"
	fCondition  = "Condition"
	fMedication = "MedicationRequest"
	fCarePlan   = "CarePlan"
	fDevice     = "Device"
	fPract      = "Practitioner"
)

func res(xs ...string) []string { return xs }

const (
	approved    = "APPROVED"
	draft       = "DRAFT"
	underReview = "UNDER_REVIEW"
	rejected    = "REJECTED"
	deprecated  = "DEPRECATED"
)

// assetSpecs is the marketplace catalogue: every asset type, pricing type and status.
var assetSpecs = []assetSpec{
	// MODEL
	{name: NEWS2ModelName, typ: "MODEL", category: "Early Warning", version: "2.3.0", publisher: "VitalSignal Labs",
		description: "Royal College of Physicians NEWS2 aggregate score from respiratory rate, SpO2, supplemental oxygen, systolic blood pressure, pulse, consciousness and temperature, with the clinical-risk band and per-parameter breakdown.",
		price:       free(), fhir: res(fPatient, fObs), badges: []string{badgeHIPAA, badgeSOC2},
		rating: 4.8, downloads: 18240, status: approved, runtime: "news2"},
	{name: QSOFAModelName, typ: "MODEL", category: "Sepsis", version: "1.4.2", publisher: "VitalSignal Labs",
		description: "Quick SOFA bedside screen (respiratory rate ≥ 22, systolic BP ≤ 100, altered mentation) flagging adults with suspected infection at risk of poor outcome.",
		price:       usage(0.002, 10000), fhir: res(fPatient, fObs), badges: []string{badgeHIPAA},
		rating: 4.5, downloads: 9312, status: approved, runtime: "qsofa"},
	{name: DeteriorationModelName, typ: "MODEL", category: "Early Warning", version: "0.1.0", publisher: "VitalSignal Labs",
		description: "Probability of deterioration within 12 hours from heart rate, respiratory rate, SpO2, systolic blood pressure and temperature: a logistic regression trained on synthetic vital signs (models/demo/train.py) and served on carehub's embedded ONNX Runtime. A demonstration of real inference, not for clinical use.",
		price:       free(), fhir: res(fPatient, fObs), badges: []string{},
		rating: 0, downloads: 0, status: approved, runtime: "onnx",
		model: models.Deterioration, modelSignature: models.DeteriorationSignature},
	{name: "Sepsis Onset Predictor (6h)", typ: "MODEL", category: "Sepsis", version: "3.0.1", publisher: "Cardiolytics",
		description: "Gradient-boosted model predicting sepsis onset within six hours from vitals, labs and encounter context; validated on 41 000 adult inpatient stays.",
		price:       subscription(1200, 12000), fhir: res(fPatient, fObs, fEncounter, fCondition), badges: []string{badgeHIPAA, badgeFDA, badgeSOC2},
		rating: 4.4, downloads: 2150, status: approved},
	{name: "Chest X-ray Triage", typ: "MODEL", category: "Radiology", version: "5.2.0", publisher: "Radiant Imaging AI",
		description: "Flags pneumothorax, pleural effusion and consolidation on frontal chest radiographs and reprioritises the reading worklist.",
		price:       enterprise(85000), fhir: res(fPatient, fReport), badges: []string{badgeHIPAA, badgeFDA, badgeHITRUST},
		rating: 4.7, downloads: 3420, status: approved},
	{name: "Atrial Fibrillation Detector", typ: "MODEL", category: "Cardiology", version: "2.1.0", publisher: "Cardiolytics",
		description: "Detects atrial fibrillation and flutter on single-lead ECG strips from wearables and 12-lead resting ECGs.",
		price:       usage(0.01, 2000), fhir: res(fPatient, fObs, fDevice), badges: []string{badgeHIPAA, badgeFDA},
		rating: 4.6, downloads: 5870, status: approved},
	{name: "Heart Failure Readmission Risk", typ: "MODEL", category: "Cardiology", version: "1.8.0", publisher: "Northwind Health Innovation",
		description: "Estimates 30-day readmission risk at discharge for patients admitted with heart failure, with the top contributing factors.",
		price:       subscription(900, 9000), fhir: res(fPatient, fEncounter, fCondition, fMedication), badges: []string{badgeHIPAA, badgeSOC2},
		rating: 4.2, downloads: 1630, status: approved},
	{name: "LACE+ Readmission Index", typ: "MODEL", category: "Population Health", version: "1.0.3", publisher: "OpenFHIR Collective",
		description: "Open implementation of the LACE+ index (length of stay, acuity, comorbidity, emergency visits) over FHIR encounters and conditions.",
		price:       free(), fhir: res(fPatient, fEncounter, fCondition), badges: []string{badgeHIPAA},
		rating: 4.1, downloads: 7400, status: approved},
	{name: "Diabetic Retinopathy Screener", typ: "MODEL", category: "Ophthalmology", version: "2.0.0", publisher: "Radiant Imaging AI",
		description: "Grades referable diabetic retinopathy from two-field fundus photographs taken in primary care.",
		price:       enterprise(60000), fhir: res(fPatient, fReport), badges: []string{badgeHIPAA, badgeFDA},
		rating: 4.5, downloads: 1190, status: approved},
	{name: "Acute Kidney Injury Early Warning", typ: "MODEL", category: "Early Warning", version: "0.9.0", publisher: "Great Lakes Clinical Research Institute",
		description: "Predicts KDIGO stage 2+ acute kidney injury 48 hours ahead from creatinine trends, urine output and nephrotoxic medication exposure.",
		price:       usage(0.005, 0), fhir: res(fPatient, fObs, fMedication), badges: []string{badgeHIPAA},
		status: underReview},
	{name: "Pulmonary Nodule Tracker", typ: "MODEL", category: "Radiology", version: "1.2.4", publisher: "Radiant Imaging AI",
		description: "Measures and tracks pulmonary nodules across serial CT studies. Superseded by Chest CT Follow-up Assistant.",
		price:       subscription(700, 7000), fhir: res(fPatient, fReport), badges: []string{badgeHIPAA},
		rating: 3.9, downloads: 860, status: deprecated},
	{name: "Inpatient Fall Risk Predictor", typ: "MODEL", category: "Patient Safety", version: "0.3.0", publisher: "Raman Clinical Informatics",
		description: "Predicts inpatient falls from mobility assessments, sedating medications and overnight vitals.",
		price:       free(), fhir: res(fPatient, fObs, fMedication), status: draft},
	{name: "Opioid Overdose Risk Model", typ: "MODEL", category: "Behavioral Health", version: "1.0.0", publisher: "Helix Data Partners",
		description: "Scores twelve-month opioid overdose risk from prescribing history and prior encounters.",
		price:       usage(0.008, 0), fhir: res(fPatient, fMedication, fEncounter),
		status: rejected, reviewNotes: "Rejected: validation cohort under-represents rural patients and calibration was not reported by subgroup; resubmit with subgroup calibration."},

	// AGENT
	{name: NEWS2AgentName, typ: "AGENT", category: "Early Warning", version: "1.6.0", publisher: "VitalSignal Labs",
		description: "Watches each patient's latest vitals, computes NEWS2, explains the contributing parameters and recommends an escalation level (ward review, urgent response, emergency response).",
		price:       usage(0.004, 5000), fhir: res(fPatient, fObs, fEncounter), badges: []string{badgeHIPAA, badgeSOC2},
		rating: 4.9, downloads: 12875, status: approved, runtime: "news2"},
	{name: QSOFAAgentName, typ: "AGENT", category: "Sepsis", version: "2.0.2", publisher: "VitalSignal Labs",
		description: "Screens patients with qSOFA on every new vitals set and drafts a sepsis bundle checklist when two or more criteria are met.",
		price:       subscription(1500, 15000), fhir: res(fPatient, fObs, fCondition), badges: []string{badgeHIPAA, badgeHITRUST},
		rating: 4.6, downloads: 4310, status: approved, runtime: "qsofa"},
	{name: VitalsTrendAgentName, typ: "AGENT", category: "Remote Monitoring", version: "1.1.0", publisher: "VitalSignal Labs",
		description: "Summarises 72-hour trends in heart rate, respiratory rate, SpO2, blood pressure and temperature for remote-monitoring nurses.",
		price:       free(), fhir: res(fPatient, fObs, fDevice), badges: []string{badgeHIPAA},
		rating: 4.3, downloads: 6020, status: approved, runtime: "vitals_trend"},
	{name: "Discharge Summary Drafter", typ: "AGENT", category: "Documentation", version: "3.4.0", publisher: "Scribewell",
		description: "Drafts the hospital course, discharge medications and follow-up sections of the discharge summary for clinician sign-off.",
		price:       usage(0.03, 500), fhir: res(fPatient, fEncounter, fCondition, fMedication, fPract), badges: []string{badgeHIPAA, badgeSOC2},
		rating: 4.4, downloads: 8790, status: approved},
	{name: "Prior Authorization Assistant", typ: "AGENT", category: "Utilization Management", version: "2.2.1", publisher: "CarePath Analytics",
		description: "Assembles clinical evidence for prior authorization requests against payer criteria and tracks determinations.",
		price:       enterprise(48000), fhir: res(fPatient, fCondition, fMedication, fReport), badges: []string{badgeHIPAA, badgeSOC2, badgeHITRUST},
		rating: 4.0, downloads: 740, status: approved},
	{name: "Care Gap Closure Agent", typ: "AGENT", category: "Population Health", version: "1.3.0", publisher: "Northwind Health Innovation",
		description: "Finds overdue screenings and chronic-care measures across a panel and drafts outreach lists per care team.",
		price:       subscription(650, 6500), fhir: res(fPatient, fCondition, fCarePlan, fEncounter), badges: []string{badgeHIPAA},
		rating: 4.2, downloads: 1980, status: approved},
	{name: "Medication Reconciliation Agent", typ: "AGENT", category: "Pharmacy", version: "0.8.0", publisher: "Scribewell",
		description: "Compares home medications with admission orders and highlights omissions, duplications and dose discrepancies.",
		price:       usage(0.02, 0), fhir: res(fPatient, fMedication, fEncounter), badges: []string{badgeHIPAA},
		status: underReview},
	{name: "Ambient Clinical Note Agent", typ: "AGENT", category: "Documentation", version: "4.0.0", publisher: "Scribewell",
		description: "Turns the recorded clinic conversation into a structured SOAP note with problem-oriented assessment and plan.",
		price:       subscription(299, 2990), fhir: res(fPatient, fEncounter, fPract), badges: []string{badgeHIPAA, badgeSOC2},
		rating: 4.7, downloads: 15420, status: approved},
	{name: "Patient Outreach Agent", typ: "AGENT", category: "Population Health", version: "0.1.0", publisher: "CarePath Analytics",
		description: "Schedules reminder messages for missed remote-monitoring readings and escalates non-responders to a nurse.",
		price:       free(), fhir: res(fPatient, fCarePlan), status: draft},
	{name: "Symptom Triage Chat Agent", typ: "AGENT", category: "Triage", version: "1.0.0", publisher: "Raman Clinical Informatics",
		description: "Conversational symptom checker that recommends a care setting (self-care, primary care, urgent care, emergency).",
		price:       usage(0.015, 1000), fhir: res(fPatient, fCondition),
		status: rejected, reviewNotes: "Rejected: under-triaged 4 of 60 emergency vignettes in clinical safety review; no escalation path to a clinician."},

	// CONNECTOR
	{name: "FHIR R4 Bulk Data Connector", typ: "CONNECTOR", category: "Interoperability", version: "2.5.0", publisher: "OpenFHIR Collective",
		description: "Exports patients, encounters and observations through the FHIR Bulk Data ($export) API into NDJSON, with incremental _since runs.",
		price:       free(), fhir: res(fPatient, fObs, fEncounter, fCondition, fMedication), badges: []string{badgeONC, badgeHIPAA},
		rating: 4.6, downloads: 11240, status: approved},
	{name: "HL7 v2 ADT Feed Connector", typ: "CONNECTOR", category: "Interoperability", version: "3.1.2", publisher: "Northwind Health Innovation",
		description: "Converts HL7 v2 ADT^A01/A03/A08 messages to FHIR Encounter and Patient updates over MLLP or SFTP.",
		price:       subscription(400, 4000), fhir: res(fPatient, fEncounter), badges: []string{badgeHIPAA, badgeSOC2},
		rating: 4.3, downloads: 3650, status: approved},
	{name: "Remote Monitoring Device Hub", typ: "CONNECTOR", category: "Remote Monitoring", version: "1.9.0", publisher: "VitalSignal Labs",
		description: "Ingests readings from Bluetooth blood-pressure cuffs, pulse oximeters and wearables and posts them as FHIR vital-sign Observations.",
		price:       usage(0.0005, 100000), fhir: res(fObs, fDevice, fPatient), badges: []string{badgeHIPAA, badgeSOC2},
		rating: 4.5, downloads: 7310, status: approved},
	{name: "Claims 837/835 Connector", typ: "CONNECTOR", category: "Revenue Cycle", version: "2.0.0", publisher: "CarePath Analytics",
		description: "Maps X12 837 claims and 835 remittances to encounters and conditions for payer analytics.",
		price:       enterprise(36000), fhir: res(fPatient, fEncounter, fCondition), badges: []string{badgeHIPAA, badgeHITRUST},
		rating: 3.8, downloads: 420, status: approved},
	{name: "DICOMweb Gateway", typ: "CONNECTOR", category: "Radiology", version: "1.4.1", publisher: "Radiant Imaging AI",
		description: "Bridges PACS to imaging models over DICOMweb (QIDO-RS, WADO-RS, STOW-RS) and returns results as DiagnosticReports.",
		price:       subscription(550, 5500), fhir: res(fReport, fPatient), badges: []string{badgeHIPAA},
		rating: 4.1, downloads: 1275, status: approved},
	{name: "SMART on FHIR Launch Kit", typ: "CONNECTOR", category: "Interoperability", version: "1.0.5", publisher: "OpenFHIR Collective",
		description: "EHR launch and standalone launch scaffolding with PKCE, token refresh and patient-context handling.",
		price:       free(), fhir: res(fPatient, fPract), badges: []string{badgeONC},
		rating: 4.4, downloads: 5480, status: approved},
	{name: "CDS Hooks Bridge", typ: "CONNECTOR", category: "Interoperability", version: "0.6.0", publisher: "Raman Clinical Informatics",
		description: "Serves marketplace models as CDS Hooks services (patient-view, order-sign) with card rendering.",
		price:       free(), fhir: res(fPatient, fMedication, fObs), status: underReview},

	// DATASET
	{name: "Synthetic ICU Vitals (10k stays)", typ: "DATASET", category: "Critical Care", version: "2024.2", publisher: "Great Lakes Clinical Research Institute",
		description: "Ten thousand synthetic ICU stays with minute-level vitals, interventions and outcomes for training early-warning models; contains no PHI.",
		price:       free(), fhir: res(fPatient, fObs, fEncounter),
		rating: 4.5, downloads: 4820, status: approved},
	{name: "De-identified Sepsis Cohort 2019-2024", typ: "DATASET", category: "Sepsis", version: "1.2", publisher: "Great Lakes Clinical Research Institute",
		description: "Expert-determination de-identified cohort of 18 400 adult sepsis admissions with Sepsis-3 labels, vitals, labs and antibiotics timing.",
		price:       enterprise(25000), fhir: res(fPatient, fObs, fEncounter, fCondition, fMedication), badges: []string{badgeHIPAA},
		rating: 4.6, downloads: 310, status: approved},
	{name: "Labeled Chest Radiograph Set", typ: "DATASET", category: "Radiology", version: "3.0", publisher: "Radiant Imaging AI",
		description: "112 000 frontal chest radiographs with radiologist-adjudicated labels for 14 findings.",
		price:       subscription(800, 8000), fhir: res(fReport), badges: []string{badgeHIPAA},
		rating: 4.2, downloads: 690, status: approved},
	{name: "Community SDOH Index", typ: "DATASET", category: "Population Health", version: "2025.1", publisher: "CarePath Analytics",
		description: "Census-tract social determinants of health index (housing, food access, transport, broadband) keyed for patient address geocoding.",
		price:       free(), fhir: res(fPatient),
		rating: 3.9, downloads: 2240, status: approved},
	{name: "ECG Waveform Benchmark", typ: "DATASET", category: "Cardiology", version: "0.2", publisher: "Cardiolytics",
		description: "Benchmark of 12-lead ECG waveforms with rhythm labels for comparing arrhythmia detectors.",
		price:       subscription(300, 3000), fhir: res(fObs, fDevice), status: draft},
	{name: "Medication Adherence Claims Extract", typ: "DATASET", category: "Pharmacy", version: "2021.4", publisher: "Helix Data Partners",
		description: "Proportion-of-days-covered extract from pharmacy claims for statins, RAS antagonists and diabetes medications. No longer refreshed.",
		price:       subscription(450, 4500), fhir: res(fPatient, fMedication),
		rating: 3.4, downloads: 380, status: deprecated},

	// SOLUTION
	{name: "Sepsis Early Warning Program", typ: "SOLUTION", category: "Sepsis", version: "2.0.0", publisher: "VitalSignal Labs",
		description: "End-to-end sepsis program: qSOFA and NEWS2 screening, rapid-response alerting, bundle compliance tracking and monthly outcome reports.",
		price:       enterprise(120000), fhir: res(fPatient, fObs, fEncounter, fCondition, fMedication, fCarePlan), badges: []string{badgeHIPAA, badgeSOC2, badgeHITRUST},
		rating: 4.7, downloads: 260, status: approved},
	{name: "Hospital-at-Home Command Center", typ: "SOLUTION", category: "Remote Monitoring", version: "1.5.0", publisher: "Northwind Health Innovation",
		description: "Virtual ward for acute care at home: device kits, continuous vitals, escalation rules and nurse and physician rounding lists.",
		price:       enterprise(150000), fhir: res(fPatient, fObs, fDevice, fEncounter, fCarePlan, fPract), badges: []string{badgeHIPAA, badgeSOC2},
		rating: 4.5, downloads: 145, status: approved},
	{name: "Heart Failure Remote Care Bundle", typ: "SOLUTION", category: "Cardiology", version: "1.2.0", publisher: "Cardiolytics",
		description: "Daily weight, blood pressure and symptom monitoring for heart failure patients with diuretic titration prompts for the care team.",
		price:       subscription(2400, 24000), fhir: res(fPatient, fObs, fCarePlan, fMedication), badges: []string{badgeHIPAA},
		rating: 4.3, downloads: 390, status: approved},
	{name: "Value-Based Care Analytics Suite", typ: "SOLUTION", category: "Population Health", version: "3.3.0", publisher: "CarePath Analytics",
		description: "Attribution, risk adjustment, quality measures and total cost of care dashboards for ACOs and payers.",
		price:       enterprise(90000), fhir: res(fPatient, fEncounter, fCondition, fPract), badges: []string{badgeHIPAA, badgeHITRUST},
		rating: 4.0, downloads: 210, status: approved},
	{name: "Radiology Worklist Prioritization", typ: "SOLUTION", category: "Radiology", version: "1.0.0", publisher: "Radiant Imaging AI",
		description: "Combines imaging triage models and order urgency to reorder radiologist worklists across sites.",
		price:       subscription(3000, 30000), fhir: res(fReport, fPatient, fPract), badges: []string{badgeHIPAA, badgeFDA},
		status: underReview},

	// APP
	{name: "Rapid Response Team Dashboard", typ: "APP", category: "Early Warning", version: "2.4.0", publisher: "VitalSignal Labs",
		description: "Hospital-wide board of NEWS2 and qSOFA alerts by ward, with acknowledgement, escalation timers and handover notes.",
		price:       subscription(650, 6500), fhir: res(fPatient, fObs, fEncounter, fPract), badges: []string{badgeHIPAA, badgeSOC2},
		rating: 4.6, downloads: 2960, status: approved},
	{name: "Patient Vitals Companion", typ: "APP", category: "Remote Monitoring", version: "3.0.2", publisher: "OpenFHIR Collective",
		description: "Patient-facing mobile app for recording home vitals and symptoms, with reminders and care-team messaging.",
		price:       free(), fhir: res(fPatient, fObs, fDevice, fCarePlan), badges: []string{badgeHIPAA},
		rating: 4.4, downloads: 21430, status: approved},
	{name: "Clinical Documentation Quality Checker", typ: "APP", category: "Documentation", version: "1.7.0", publisher: "Scribewell",
		description: "Checks notes for missing specificity, unsupported diagnoses and copy-forward text before signing.",
		price:       usage(0.01, 1000), fhir: res(fEncounter, fCondition, fPract), badges: []string{badgeHIPAA, badgeSOC2},
		downloads: 35, status: approved},
	{name: "Care Team Huddle Board", typ: "APP", category: "Care Coordination", version: "1.3.9", publisher: "Helix Data Partners",
		description: "Daily huddle board of admissions, discharges and at-risk patients per unit. Replaced by Rapid Response Team Dashboard.",
		price:       free(), fhir: res(fPatient, fEncounter), badges: []string{badgeHIPAA},
		rating: 3.6, downloads: 1510, status: deprecated},
	{name: "Antibiotic Stewardship Console", typ: "APP", category: "Infectious Disease", version: "0.9.5", publisher: "CarePath Analytics",
		description: "Reviews broad-spectrum antibiotic orders against culture results and suggests de-escalation.",
		price:       subscription(500, 5000), fhir: res(fMedication, fReport, fPatient), badges: []string{badgeHIPAA},
		status: rejected, reviewNotes: "Rejected: recommendations were not traceable to local antibiogram data; security review found PHI in application logs."},
}

// installSpec installs an approved asset into a project.
type installSpec struct {
	org, project, asset string
	config              string // JSON, "" stores NULL
}

var installSpecs = []installSpec{
	{DemoOrgSlug, SepsisProjectName, NEWS2AgentName, `{"alertThreshold":5,"escalateTo":"rapid-response-team","wards":["7","8"]}`},
	{DemoOrgSlug, SepsisProjectName, QSOFAModelName, `{"threshold":2}`},
	{DemoOrgSlug, SepsisProjectName, NEWS2ModelName, ""},
	{DemoOrgSlug, SepsisProjectName, DeteriorationModelName, ""},
	{DemoOrgSlug, RPMProjectName, VitalsTrendAgentName, `{"windowHours":72}`},
	{DemoOrgSlug, RPMProjectName, "Remote Monitoring Device Hub", `{"deviceTypes":["wearable","home-bp-cuff","pulse-oximeter"]}`},
	{DemoOrgSlug, "Radiology AI Pilot", "Chest X-ray Triage", `{"modalities":["CR","DX"]}`},
	{"northwind-health", "ICU Sepsis Bundle", QSOFAAgentName, `{"threshold":2}`},
	{"northwind-health", "Inpatient Deterioration", "FHIR R4 Bulk Data Connector", ""},
	{"bluecrest-health-plan", "Care Management Outreach", "Care Gap Closure Agent", ""},
}

type agentSpec struct {
	org, project, name, description, runMode, skill, installAsset string
}

var agentSpecs = []agentSpec{
	{DemoOrgSlug, SepsisProjectName, Ward7AgentName,
		"Scores NEWS2 for Ward 7 inpatients from bedside-monitor vitals and escalates scores of 5 or more to the rapid response team.",
		"sync", "news2", NEWS2AgentName},
	{DemoOrgSlug, RPMProjectName, "Home Vitals Trend Agent",
		"Summarises 72-hour vitals trends for patients in the CHF and COPD home programmes before the daily nurse call.",
		"async", "vitals_trend", VitalsTrendAgentName},
	{"northwind-health", "ICU Sepsis Bundle", "ICU Sepsis Sentinel",
		"Runs qSOFA on each new ICU vitals set and opens a sepsis bundle checklist when positive.",
		"sync", "qsofa", QSOFAAgentName},
}

type workflowSpec struct {
	org, project, name, description, status string
	steps                                   []string
}

var workflowSpecs = []workflowSpec{
	{DemoOrgSlug, SepsisProjectName, DeteriorationWorkflowName,
		"Scores NEWS2 on a patient's latest vitals and raises an alert for the rapid response team when the risk is high.",
		"ACTIVE", []string{"load_patient", "latest_vitals", "score_news2", "assess_risk", "create_alert"}},
	{DemoOrgSlug, SepsisProjectName, "Sepsis screen",
		"Screens a patient with qSOFA and notifies the sepsis coordinator when two or more criteria are met.",
		"PAUSED", []string{"load_patient", "latest_vitals", "score_qsofa", "assess_risk", "notify"}},
}

// Creation times of the catalogue, all before the anchor: organizations a year and more before,
// then publishers, assets, installations, agents and workflows.
func orgCreated(i int) time.Time {
	return Anchor().Add(-400*day + time.Duration(i)*17*day + 9*time.Hour + 30*time.Minute)
}

const day = 24 * time.Hour

// catalogue builds every row but the patient data, and records ids for later lookups.
func (d *dataset) catalogue() error {
	type orgRef struct {
		id      string
		created time.Time
	}
	orgs := map[string]orgRef{}
	for i, o := range orgSpecs {
		created := orgCreated(i)
		id := idAt(ids.Organization, created, "org/"+o.slug)
		orgs[o.slug] = orgRef{id, created}
		d.orgID[o.slug] = id
		d.organizations.add(id, o.name, o.slug, o.typ, o.plan, nullString(o.fhirBase), o.hipaa, o.members, created)
		for j, name := range o.projects {
			pc := created.Add(time.Duration(j+1)*4*day + 2*time.Hour)
			pid := idAt(ids.Project, pc, "project/"+o.slug+"/"+name)
			d.projectID[o.slug+"/"+name] = pid
			d.projects.add(pid, id, name, pc)
		}
	}

	pubs := map[string]publisherSpec{}
	for i, p := range publisherSpecs {
		created := Anchor().Add(-260*day + time.Duration(i)*5*day + 15*time.Hour)
		id := idAt(ids.Publisher, created, "publisher/"+p.name)
		pubs[p.name] = p
		d.publisherID[p.name] = id
		var orgID any
		if p.org != "" {
			ref, ok := orgs[p.org]
			if !ok {
				return fmt.Errorf("publisher %q: unknown organization %q", p.name, p.org)
			}
			orgID = ref.id
		}
		d.publishers.add(id, p.name, p.email(), orgID, p.verified, created)
	}

	for i, a := range assetSpecs {
		p, ok := pubs[a.publisher]
		if !ok {
			return fmt.Errorf("asset %q: unknown publisher %q", a.name, a.publisher)
		}
		if _, dup := d.assetID[a.name]; dup {
			return fmt.Errorf("asset %q: duplicate name", a.name)
		}
		created := Anchor().Add(-230*day + time.Duration(i)*4*day + time.Duration(10+i%7)*time.Hour)
		updated := created.Add(time.Duration(3+i%20) * day)
		if limit := Anchor().Add(-day); updated.After(limit) {
			updated = limit
		}
		id := idAt(ids.Asset, created, "asset/"+a.name)
		d.assetID[a.name] = id
		d.assetStatus[a.name] = a.status

		badges := slices.Clone(a.badges)
		if badges == nil {
			badges = []string{}
		}
		if p.verified && (a.status == approved || a.status == deprecated) {
			badges = append(badges, badgeVerified)
		}
		if a.rating >= 4.7 && a.downloads >= 1000 {
			badges = append(badges, badgeTop)
		}
		sc := assetScores(a, badges)
		var submittedBy, rating, docs, notes any
		if p.org != "" {
			submittedBy = orgs[p.org].id
		}
		if a.rating > 0 {
			rating = a.rating
		}
		if a.status != draft {
			docs = "https://docs." + p.domain + "/" + slugify(a.name)
		}
		if a.reviewNotes != "" {
			notes = a.reviewNotes
		}
		var runtime any
		if a.runtime != "" {
			runtime = a.runtime
		}
		d.assets.add(id, d.publisherID[a.publisher], submittedBy, a.name, a.description, a.typ, a.category, a.version,
			a.price.typ, a.price.costPerRequest, a.price.monthlyFee, a.price.annual, a.price.freeTierLimit,
			a.fhir, sc.overall, sc.security, sc.privacy, sc.clinical,
			slices.Contains(badges, badgeHIPAA), slices.Contains(badges, badgeFDA), badges,
			rating, a.downloads, a.status, runtime, docs, "support@"+p.domain, notes, created, updated)
		if a.model != nil {
			sum := sha256.Sum256(a.model)
			digest := hex.EncodeToString(sum[:])
			d.modelArtifacts.add(digest, "onnx", len(a.model), json.RawMessage(a.modelSignature), a.model, created)
			d.assetModels.add(id, a.version, digest, "demo", created)
		}
	}

	installedAt := map[string]time.Time{}
	for i, in := range installSpecs {
		pid, ok := d.projectID[in.org+"/"+in.project]
		if !ok {
			return fmt.Errorf("installation: unknown project %s/%s", in.org, in.project)
		}
		aid, ok := d.assetID[in.asset]
		if !ok || d.assetStatus[in.asset] != approved {
			return fmt.Errorf("installation: %q is not an approved asset", in.asset)
		}
		at := Anchor().Add(-40*day + time.Duration(i)*2*day + 14*time.Hour)
		key := in.org + "/" + in.project + "/" + in.asset
		id := idAt(ids.Installation, at, "installation/"+key)
		d.installationID[key] = id
		installedAt[key] = at
		var config any
		if in.config != "" {
			config = json.RawMessage(in.config)
		}
		d.installations.add(id, orgs[in.org].id, pid, aid, "installed", config, at)
	}

	for _, a := range agentSpecs {
		key := a.org + "/" + a.project + "/" + a.installAsset
		ins, ok := d.installationID[key]
		if !ok {
			return fmt.Errorf("agent %q: %s is not installed", a.name, key)
		}
		created := installedAt[key].Add(day + 3*time.Hour)
		id := idAt(ids.Agent, created, "agent/"+a.org+"/"+a.name)
		d.agents.add(id, orgs[a.org].id, d.projectID[a.org+"/"+a.project], a.name, a.description, a.runMode, "active", a.skill, ins, created)
	}

	for i, w := range workflowSpecs {
		created := Anchor().Add(-20*day + time.Duration(i)*day + 11*time.Hour)
		id := idAt(ids.Workflow, created, "workflow/"+w.org+"/"+w.name)
		d.workflows.add(id, orgs[w.org].id, d.projectID[w.org+"/"+w.project], w.name, w.description, w.status, w.steps, []string{}, created, created)
	}
	return nil
}

type scores struct{ overall, security, privacy, clinical int }

// assetScores derives the compliance score from the badges, so the two never disagree: HIPAA puts
// privacy at 86 or more (without it, 72 or less), FDA clearance does the same for clinical safety,
// SOC 2 and HITRUST raise security. A draft has not been reviewed and scores 0; a rejection lowers
// the safety and security scores that caused it.
func assetScores(a assetSpec, badges []string) scores {
	if a.status == draft {
		return scores{}
	}
	r := stream("scores/" + a.name)
	has := func(b string) bool { return slices.Contains(badges, b) }
	s := scores{security: 62 + r.IntN(9), privacy: 60 + r.IntN(9), clinical: 62 + r.IntN(9)}
	if has(badgeSOC2) {
		s.security += 16
	}
	if has(badgeHITRUST) {
		s.security += 10
		s.privacy += 4
	}
	if has(badgeHIPAA) {
		s.privacy += 26
	}
	if has(badgeFDA) {
		s.clinical += 24
	}
	if has(badgeONC) {
		s.clinical += 6
	}
	if a.status == rejected {
		s.clinical -= 22
		s.security -= 12
	}
	s.security, s.privacy, s.clinical = min(s.security, 99), min(s.privacy, 99), min(s.clinical, 99)
	s.overall = (s.security + s.privacy + s.clinical + 1) / 3
	return s
}

func slugify(s string) string {
	var b strings.Builder
	dash := false
	for _, c := range strings.ToLower(s) {
		switch {
		case c >= 'a' && c <= 'z' || c >= '0' && c <= '9':
			b.WriteRune(c)
			dash = false
		case !dash && b.Len() > 0:
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}
