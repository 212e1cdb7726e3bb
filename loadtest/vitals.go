package loadtest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"carehub/kernel/ids"
	obswire "carehub/schemas/kafka/observation"
)

// vitalSpec is one LOINC vital sign a simulated device reports: a normal range the readings
// wander in, and how it is coded.
type vitalSpec struct {
	loinc, display, unit string
	lo, hi               float64
	decimals             int
	device               string
}

var vitalSpecs = []vitalSpec{
	{"8867-4", "Heart rate", "/min", 55, 110, 0, "wearable"},
	{"9279-1", "Respiratory rate", "/min", 12, 24, 0, "wearable"},
	{"59408-5", "Oxygen saturation in Arterial blood by Pulse oximetry", "%", 91, 99, 0, "pulse-oximeter"},
	{"8480-6", "Systolic blood pressure", "mm[Hg]", 100, 160, 0, "home-bp-cuff"},
	{"8462-4", "Diastolic blood pressure", "mm[Hg]", 60, 95, 0, "home-bp-cuff"},
	{"8310-5", "Body temperature", "Cel", 36.1, 38.4, 1, "smart-thermometer"},
}

// observation is one generated reading: the FHIR JSON a device sends, and the message intake
// would produce for it (the raw-produce baseline sends the same bytes).
type observation struct {
	patientID string
	fhir      []byte
	message   []byte
}

// generator makes realistic vital-sign observations for a set of patients: each patient has a
// baseline per vital, and readings drift around it.
type generator struct {
	r        *rand.Rand
	orgID    string
	patients []string
	baseline map[string][]float64
}

func newGenerator(seed uint64, orgID string, patients []string) *generator {
	g := &generator{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), orgID: orgID, patients: patients, baseline: map[string][]float64{}}
	for _, p := range patients {
		b := make([]float64, len(vitalSpecs))
		for i, v := range vitalSpecs {
			b[i] = v.lo + (v.hi-v.lo)*(0.3+0.4*g.r.Float64())
		}
		g.baseline[p] = b
	}
	return g
}

// next returns a reading of a random vital of a random patient, effective at.
func (g *generator) next(at time.Time) observation {
	p := g.patients[g.r.IntN(len(g.patients))]
	i := g.r.IntN(len(vitalSpecs))
	v := vitalSpecs[i]
	span := v.hi - v.lo
	x := g.baseline[p][i] + (g.r.Float64()-0.5)*span*0.15
	x = math.Max(v.lo, math.Min(v.hi, x))
	scale := math.Pow(10, float64(v.decimals))
	x = math.Round(x*scale) / scale
	eff := at.UTC().Format(time.RFC3339)
	value := strconv.FormatFloat(x, 'f', v.decimals, 64)
	fhir := fmt.Appendf(nil, `{"resourceType":"Observation","status":"final",`+
		`"category":[{"coding":[{"system":"http://terminology.hl7.org/CodeSystem/observation-category","code":"vital-signs","display":"Vital Signs"}]}],`+
		`"code":{"coding":[{"system":"http://loinc.org","code":"%s","display":"%s"}],"text":"%s"},`+
		`"subject":{"reference":"Patient/%s"},"effectiveDateTime":"%s",`+
		`"valueQuantity":{"value":%s,"unit":"%s","system":"http://unitsofmeasure.org","code":"%s"},`+
		`"device":{"display":"%s"}}`, v.loinc, v.display, v.display, p, eff, value, v.unit, v.unit, v.device)
	m := obswire.Message{ID: ids.New(ids.Observation), OrgID: g.orgID, PatientID: p, ReceivedAt: time.Now(), Observation: fhir,
		Status: "final", LOINC: v.loinc, Code: v.loinc, Value: x, Unit: v.unit, EffectiveAt: at.UTC().Truncate(time.Second), DeviceType: v.device}
	return observation{patientID: p, fhir: fhir, message: m.AppendJSON(nil)}
}

// body is one pre-built request.
type body struct {
	contentType string
	data        []byte
	count       int
	records     [][]byte // the messages of its observations, for the raw baseline
	keys        [][]byte
}

// bundleBody builds a FHIR batch Bundle of n observations.
func (g *generator) bundleBody(n int, at time.Time) body {
	b := body{contentType: "application/fhir+json", count: n}
	buf := []byte(`{"resourceType":"Bundle","type":"batch","entry":[`)
	for i := range n {
		o := g.next(at)
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, `{"resource":`...)
		buf = append(buf, o.fhir...)
		buf = append(buf, `,"request":{"method":"POST","url":"Observation"}}`...)
		b.records = append(b.records, o.message)
		b.keys = append(b.keys, []byte(o.patientID))
	}
	b.data = append(buf, "]}"...)
	return b
}

// ndjsonBody builds an NDJSON stream of n observations.
func (g *generator) ndjsonBody(n int, at time.Time) body {
	b := body{contentType: "application/fhir+ndjson", count: n}
	var buf []byte
	for range n {
		o := g.next(at)
		buf = append(buf, o.fhir...)
		buf = append(buf, '\n')
		b.records = append(b.records, o.message)
		b.keys = append(b.keys, []byte(o.patientID))
	}
	b.data = buf
	return b
}
