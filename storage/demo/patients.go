package demo

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"carehub/kernel/ids"
)

// Names are drawn from common given names and invented surnames, so no combination names a real
// person while the lists still read like a patient census.
var (
	femaleNames = []string{"Amara", "Beatrice", "Camille", "Dolores", "Eleanor", "Fiona", "Gloria", "Harriet",
		"Imogen", "Josephine", "Katarina", "Lorena", "Marisol", "Nadia", "Odette", "Priya", "Rosalind", "Sabine",
		"Theodora", "Ursula", "Vivian", "Wilhelmina", "Yasmin", "Zora", "Adaeze", "Mei", "Ingrid", "Lucia", "Noor",
		"Esperanza"}
	maleNames = []string{"Abel", "Bernard", "Cyrus", "Desmond", "Emeric", "Fletcher", "Gideon", "Horace",
		"Ignatius", "Jasper", "Kwame", "Lionel", "Mateo", "Nikolai", "Osric", "Percival", "Quentin", "Rafael",
		"Silas", "Thaddeus", "Ulrich", "Vikram", "Wendell", "Xavier", "Yusuf", "Zebulon", "Hiroshi", "Tobias",
		"Anders", "Emeka"}
	neutralNames = []string{"Robin", "Sasha", "Jordan", "Rowan", "Emerson", "Quinn"}
	familyNames  = []string{"Alderwick", "Ashcombe", "Blackthorn", "Brightwater", "Castellane", "Coldbrook",
		"Dunmore", "Everhart", "Fairweather", "Fenwick", "Greywell", "Hallowell", "Hartigan", "Ivesdale",
		"Kestrel", "Larkspur", "Merriweather", "Northcott", "Oakhurst", "Pemberton-Vale", "Quillfeather",
		"Ravenscroft", "Silverlake", "Thornbury", "Underhill", "Vantrell", "Wexford", "Whitlow", "Yarrowby",
		"Adeyemi-Hart", "Castellanos-Bray", "Nakamura-Fenn", "Oyelaran-Finch", "Delacroix-Moss",
		"Varga-Lindqvist", "Okonkwo-Reyes", "Marchetti-Lowe", "Haldane", "Strandberg-Oduya", "Quintero-Wilde"}
	streets = []string{"Alder Lane", "Birchwood Drive", "Cedar Hollow Road", "Dovecote Street", "Elmstead Avenue",
		"Foxglove Court", "Granary Way", "Heron Point Road", "Ironwood Terrace", "Juniper Street",
		"Kingfisher Lane", "Linden Avenue", "Millrace Road", "Nettlebed Way", "Orchard Hill Drive",
		"Pinecrest Court", "Quarry Street", "Rookery Lane", "Saltmarsh Road", "Tanager Drive"}
)

// Care programmes patients are enrolled in.
const (
	programCHF           = "chf-remote-monitoring"
	programCOPD          = "copd-home"
	programSepsis        = "sepsis-watch"
	programDiabetes      = "diabetes-care"
	programHypertension  = "hypertension-management"
	programPostDischarge = "post-discharge"
)

var homePrograms = []string{programCHF, programCOPD, programDiabetes, programHypertension, programPostDischarge}

// patientPlan is everything drawn for one patient before rows are made.
type patientPlan struct {
	given          []string
	family, gender string
	birthDate      string
	risk           string
	inpatient      bool
	programs       []string
	synthetic      bool
	tr             trajectory
}

// Indexes, within the demo organization, of the patients the package exports by id.
const (
	deterioratingIndex = 0
	stableIndex        = 1
	realIndex          = 9
)

func planPatient(r *rand.Rand, o orgSpec, j int) patientPlan {
	p := patientPlan{synthetic: j%10 != 9 || o.typ == "developer"}
	switch {
	case o.slug == DemoOrgSlug && j == deterioratingIndex:
		p.given, p.family, p.gender, p.birthDate = []string{"Walter", "James"}, "Ashcombe", "male", "1948-03-14"
		p.risk, p.inpatient, p.programs = riskCritical, true, []string{programSepsis}
		p.tr = trajectory{
			start:  vitals{RR: 16, SpO2: 97, SBP: 128, DBP: 76, HR: 82, Temp: 37.0, O2Flow: 0, GCS: 15},
			latest: vitals{RR: 26, SpO2: 91, SBP: 95, DBP: 58, HR: 118, Temp: 38.6, O2Flow: 0, GCS: 15},
			onset:  0.35, curve: 1.6,
		}
		return p
	case o.slug == DemoOrgSlug && j == stableIndex:
		p.given, p.family, p.gender, p.birthDate = []string{"Rosa"}, "Fairweather", "female", "1971-06-02"
		p.risk, p.programs = riskLow, []string{programHypertension}
		v := vitals{RR: 16, SpO2: 97, SBP: 124, DBP: 78, HR: 72, Temp: 36.8, O2Flow: 0, GCS: 15}
		p.tr = trajectory{start: v, latest: v, curve: 1}
		return p
	}

	names := neutralNames
	switch x := r.Float64(); {
	case x < 0.485:
		p.gender, names = "female", femaleNames
	case x < 0.97:
		p.gender, names = "male", maleNames
	default:
		p.gender = "other"
	}
	p.given = []string{pick(r, names)}
	if middle := pick(r, names); r.IntN(4) == 0 && middle != p.given[0] {
		p.given = append(p.given, middle)
	}
	p.family = pick(r, familyNames)

	switch x := r.Float64(); {
	case x < 0.56:
		p.risk = riskLow
	case x < 0.81:
		p.risk = riskModerate
	case x < 0.94:
		p.risk = riskHigh
	default:
		p.risk = riskCritical
	}
	if o.typ == "health_system" {
		switch p.risk {
		case riskHigh, riskCritical:
			p.inpatient = r.Float64() < 0.75
		case riskModerate:
			p.inpatient = r.Float64() < 0.2
		}
	}

	age := between(r, 24, 94)
	switch {
	case p.inpatient:
		if p.risk == riskHigh || p.risk == riskCritical || r.IntN(2) == 0 {
			p.programs = append(p.programs, programSepsis)
		}
		if r.IntN(3) == 0 {
			p.programs = append(p.programs, pick(r, homePrograms[:4]))
		}
	case p.risk == riskLow && r.IntN(5) == 0:
		// Not enrolled in any programme.
	default:
		p.programs = append(p.programs, pick(r, homePrograms))
		if second := pick(r, homePrograms); r.IntN(3) == 0 && second != p.programs[0] {
			p.programs = append(p.programs, second)
		}
	}
	if len(p.programs) > 0 {
		age = between(r, 52, 94)
	}
	birth := Anchor().AddDate(-age, 0, -between(r, 0, 364))
	p.birthDate = birth.Format(time.DateOnly)
	p.tr = newTrajectory(r, p.risk)
	return p
}

// patients builds patients, their encounters and their vital-sign observations.
func (d *dataset) patients() error {
	g := 0 // index over all organizations
	for _, o := range orgSpecs {
		orgID := d.orgID[o.slug]
		for j := 0; j < o.patients; j, g = j+1, g+1 {
			key := fmt.Sprintf("patient/%s/%d", o.slug, j)
			r := stream(key)
			created := Anchor().Add(-300*day + time.Duration(g)*30*time.Hour + time.Duration(r.IntN(600))*time.Minute)
			id := idAt(ids.Patient, created, key)
			p := planPatient(r, o, j)
			if o.slug == DemoOrgSlug {
				switch j {
				case deterioratingIndex:
					d.deterioratingID = id
				case stableIndex:
					d.stableID = id
				case realIndex:
					d.realID = id
				}
			}

			latest := Anchor().Add(-time.Duration(between(r, 5, 115)) * time.Minute)
			first := latest.Add(-(readingsPerPatient - 1) * readingIntervalH * time.Hour)
			subject := mustJSON(reference{Reference: "Patient/" + id})
			d.observationRows(r, orgID, id, subject, p, latest)
			d.encounterRows(r, orgID, id, subject, p, created, first)

			name := []humanName{{Use: "official", Family: p.family, Given: p.given}}
			c := pick(r, o.cities)
			addr := []address{{Use: "home", Line: []string{strconv.Itoa(between(r, 12, 4980)) + " " + pick(r, streets)},
				City: c.name, State: o.state, PostalCode: c.zip, Country: "US"}}
			telecom := []contactPoint{{System: "phone", Value: pick(r, o.areaCodes) + "-555-01" + fmt.Sprintf("%02d", r.IntN(100)),
				Use: pick(r, []string{"home", "mobile", "mobile"})}}
			m := meta{LastUpdated: rfc3339(latest)}
			if p.synthetic {
				m.Tag = []coding{syntheticTag}
			}
			resource := patientResource{
				ResourceType: "Patient", ID: id, Meta: m,
				Identifier: []identifier{{System: "https://" + o.slug + ".example.org/fhir/mrn", Value: fmt.Sprintf("MRN%07d", 1000003+g*7919%8999983)}},
				Active:     true, Name: name, Telecom: telecom, Gender: p.gender, BirthDate: p.birthDate, Address: addr,
				ManagingOrganization: reference{Reference: "Organization/" + orgID, Display: o.name},
			}
			programs := p.programs
			if programs == nil {
				programs = []string{}
			}
			d.patientsT.add(id, orgID, p.synthetic, mustJSON(name), p.gender, p.birthDate, mustJSON(addr), mustJSON(telecom),
				p.risk, programs, mustJSON(resource), created, latest)
		}
	}
	if d.deterioratingID == "" || d.stableID == "" || d.realID == "" {
		return fmt.Errorf("demo organization has too few patients for the named ones")
	}
	return nil
}

// device types per code for a ward patient and a patient monitored at home.
var (
	wardDevices = [len(vitalCodes)]string{"bedside-monitor", "bedside-monitor", "bedside-monitor", "bedside-monitor",
		"bedside-monitor", "bedside-monitor", "nurse-charted", "nurse-charted"}
	homeDevices = [len(vitalCodes)]string{"wearable", "pulse-oximeter", "home-bp-cuff", "home-bp-cuff",
		"wearable", "smart-thermometer", "patient-app", "patient-app"}
)

func (d *dataset) observationRows(r *rand.Rand, orgID, patientID string, subject json.RawMessage, p patientPlan, latest time.Time) {
	devices := homeDevices
	if p.inpatient {
		devices = wardDevices
	}
	for k, v := range p.tr.readings(r) {
		at := latest.Add(-time.Duration(readingsPerPatient-1-k) * readingIntervalH * time.Hour)
		for c, value := range v.values() {
			vc := vitalCodes[c]
			delay := time.Duration(between(r, 2, 40)) * time.Second
			if devices[c] == "nurse-charted" {
				delay = time.Duration(between(r, 1, 12)) * time.Minute
			}
			received := at.Add(delay)
			stored := received.Add(time.Duration(between(r, 150, 1500)) * time.Millisecond)
			id := idAt(ids.Observation, at, patientID+"/"+vc.loinc+"/"+strconv.Itoa(k))
			res := observationResource{
				ResourceType: "Observation", ID: id, Status: "final", Category: vitalSignsCategory,
				Code: codeJSON[c], Subject: subject, EffectiveDateTime: rfc3339(at), Issued: rfc3339(received),
				ValueQuantity: quantity{Value: value, Unit: vc.unit, System: "http://unitsofmeasure.org", Code: vc.unit},
				Device:        &reference{Display: devices[c]},
			}
			d.observations.add(id, orgID, patientID, "final", codeJSON[c], vc.loinc, subject, value, vc.unit, at,
				devices[c], mustJSON(res), received, stored)
		}
	}
}

// Encounter classes (v3 ActCode), as FHIR R4 Encounter.class codings.
var (
	classAMB  = coding{System: actCode, Code: "AMB", Display: "ambulatory"}
	classIMP  = coding{System: actCode, Code: "IMP", Display: "inpatient encounter"}
	classEMER = coding{System: actCode, Code: "EMER", Display: "emergency"}
	classHH   = coding{System: actCode, Code: "HH", Display: "home health"}
)

const actCode = "http://terminology.hl7.org/CodeSystem/v3-ActCode"

// encounterRows gives a ward patient the emergency visit and the inpatient stay still in progress
// that cover the observation window; a home patient a home-health episode in progress. Either
// may have an earlier clinic visit.
func (d *dataset) encounterRows(r *rand.Rand, orgID, patientID string, subject json.RawMessage, p patientPlan, created, firstReading time.Time) {
	n := 0
	add := func(class coding, start time.Time, end *time.Time) {
		status := "in-progress"
		per := period{Start: rfc3339(start)}
		if end != nil {
			status = "finished"
			per.End = rfc3339(*end)
		}
		id := idAt(ids.Encounter, start, patientID+"/"+strconv.Itoa(n))
		n++
		d.encounters.add(id, orgID, patientID, status, mustJSON(class), subject, mustJSON(per), start)
	}
	var current time.Time
	if p.inpatient {
		current = firstReading.Add(-time.Duration(between(r, 2*60, 30*60)) * time.Minute).Truncate(time.Minute)
		edStart := current.Add(-time.Duration(between(r, 3*60, 7*60)) * time.Minute)
		if r.IntN(2) == 0 {
			d.clinicVisit(r, add, created, edStart)
		}
		add(classEMER, edStart, &current)
		add(classIMP, current, nil)
		return
	}
	current = Anchor().Add(-time.Duration(between(r, 8, 60))*day + time.Duration(between(r, 9*60, 17*60))*time.Minute)
	if earliest := created.Add(2 * day); current.Before(earliest) {
		current = earliest
	}
	current = current.Truncate(time.Minute)
	if r.IntN(3) > 0 {
		d.clinicVisit(r, add, created, current)
	}
	add(classHH, current, nil)
}

// clinicVisit adds a finished ambulatory visit between the patient's registration and before.
func (d *dataset) clinicVisit(r *rand.Rand, add func(coding, time.Time, *time.Time), created, before time.Time) {
	span := int(before.Sub(created)/day) - 3
	if span < 1 {
		return
	}
	date := created.Truncate(day).Add(time.Duration(1+r.IntN(span)) * day)
	start := date.Add(time.Duration(between(r, 8*60, 16*60)) * time.Minute)
	end := start.Add(time.Duration(between(r, 20, 55)) * time.Minute)
	add(classAMB, start, &end)
}
