package clinical

import (
	"fmt"
	"math"
	"strings"
)

// Parameter names: the names used in Component.Name, InputError.Missing and
// InputError.Invalid. They follow the NEWS2 chart's rows.
const (
	ParamRespiratoryRate    = "respiratory_rate"
	ParamSpO2               = "spo2"
	ParamSpO2Scale          = "spo2_scale"
	ParamSupplementalOxygen = "supplemental_oxygen"
	ParamSystolicBP         = "systolic_bp"
	ParamHeartRate          = "heart_rate"
	ParamConsciousness      = "consciousness"
	ParamTemperature        = "temperature"
)

// Consciousness is a level on the ACVPU scale.
type Consciousness string

// ACVPU levels. NEWS2 scores Alert 0 and every other level 3.
const (
	Alert        Consciousness = "A"
	Confusion    Consciousness = "C" // new confusion (new disorientation, delirium or any new alteration of mentation)
	Voice        Consciousness = "V"
	Pain         Consciousness = "P"
	Unresponsive Consciousness = "U"
)

// ParseConsciousness accepts a level letter or its word, in any case:
// "A"/"alert", "C"/"confusion"/"new confusion", "V"/"voice", "P"/"pain",
// "U"/"unresponsive".
func ParseConsciousness(s string) (Consciousness, bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "a", "alert":
		return Alert, true
	case "c", "confusion", "new confusion", "confused":
		return Confusion, true
	case "v", "voice":
		return Voice, true
	case "p", "pain":
		return Pain, true
	case "u", "unresponsive":
		return Unresponsive, true
	}
	return "", false
}

func (c Consciousness) valid() bool {
	switch c {
	case Alert, Confusion, Voice, Pain, Unresponsive:
		return true
	}
	return false
}

// SpO2 scales of NEWS2. Scale 2 is for patients with hypercapnic
// respiratory failure and a prescribed target of 88–92 %; using it is a
// clinical decision that the RCP asks to be documented.
const (
	SpO2Scale1 = 1
	SpO2Scale2 = 2
)

// Vitals are the inputs of NEWS2 and qSOFA. Nil means not measured; a
// score that needs a nil field fails with an *InputError naming it rather
// than assuming a normal value. Values are in the canonical units of
// VitalSigns (see Normalize).
type Vitals struct {
	RespiratoryRate *float64 // breaths/min (respiratory_rate)
	SpO2            *float64 // % (spo2)
	// SpO2Scale is SpO2Scale1 or SpO2Scale2; 0 means scale 1 (spo2_scale).
	SpO2Scale int
	// OnOxygen: the patient is receiving supplemental oxygen
	// (supplemental_oxygen). Required: "room air" is a measurement, not a
	// default, because oxygen alone scores 2.
	OnOxygen   *bool
	SystolicBP *float64 // mm[Hg] (systolic_bp)
	HeartRate  *float64 // beats/min, the chart's "pulse" (heart_rate)
	// Consciousness and GCS both describe consciousness (consciousness);
	// either is enough. GCS 15 is Alert and any GCS below 15 counts as new
	// confusion. When both are given the worse one is used, so a charted
	// "A" cannot mask a GCS of 13.
	Consciousness *Consciousness
	GCS           *float64
	Temperature   *float64 // Cel (temperature)
}

// alert resolves Consciousness and GCS; ok is false when neither is given.
func (v Vitals) alert() (alert, ok bool) {
	alert = true
	if v.Consciousness != nil {
		ok = true
		alert = *v.Consciousness == Alert
	}
	if v.GCS != nil {
		ok = true
		alert = alert && *v.GCS >= 15
	}
	return alert, ok
}

// checkValue validates a present vital against the plausible range of its
// code.
func checkValue(c *inputErrors, param, code string, x *float64) {
	if x == nil {
		return
	}
	vs, _ := VitalByCode(code)
	if !vs.Plausible(*x) {
		c.bad(param, "%v %s outside plausible range %v–%v", *x, vs.Unit, vs.Min, vs.Max)
	}
}

func checkConsciousness(c *inputErrors, v Vitals) {
	if v.Consciousness != nil && !v.Consciousness.valid() {
		c.bad(ParamConsciousness, "level %q is not one of A, C, V, P, U", string(*v.Consciousness))
	}
	if v.GCS != nil {
		g := *v.GCS
		if g != math.Trunc(g) || g < 3 || g > 15 {
			c.bad(ParamConsciousness, "GCS %v is not an integer from 3 to 15", g)
		}
	}
}

// Band is a NEWS2 clinical risk band (RCP 2017, chart 3).
type Band string

// NEWS2 clinical risk bands.
const (
	BandLow       Band = "low"        // aggregate 0–4, no parameter scored 3
	BandLowMedium Band = "low-medium" // a single parameter scored 3 ("red score"), aggregate below 5
	BandMedium    Band = "medium"     // aggregate 5–6
	BandHigh      Band = "high"       // aggregate 7 or more
)

// NEWS2Subscores are the per-parameter scores of NEWS2 chart 1.
type NEWS2Subscores struct {
	RespiratoryRate    int `json:"respiratoryRate"`
	SpO2               int `json:"spo2"`
	SupplementalOxygen int `json:"supplementalOxygen"`
	SystolicBP         int `json:"systolicBP"`
	HeartRate          int `json:"heartRate"`
	Consciousness      int `json:"consciousness"`
	Temperature        int `json:"temperature"`
}

func (s NEWS2Subscores) total() int {
	return s.RespiratoryRate + s.SpO2 + s.SupplementalOxygen + s.SystolicBP + s.HeartRate + s.Consciousness + s.Temperature
}

// red lists the parameters that scored 3, in chart order.
func (s NEWS2Subscores) red() []string {
	var out []string
	for _, p := range []struct {
		name  string
		score int
	}{
		{ParamRespiratoryRate, s.RespiratoryRate}, {ParamSpO2, s.SpO2},
		{ParamSupplementalOxygen, s.SupplementalOxygen}, {ParamSystolicBP, s.SystolicBP},
		{ParamHeartRate, s.HeartRate}, {ParamConsciousness, s.Consciousness},
		{ParamTemperature, s.Temperature},
	} {
		if p.score == 3 {
			out = append(out, p.name)
		}
	}
	return out
}

// NEWS2Result is a computed NEWS2.
type NEWS2Result struct {
	Total     int            `json:"total"` // 0–20
	Subscores NEWS2Subscores `json:"subscores"`
	SpO2Scale int            `json:"spo2Scale"` // the scale used: 1 or 2
	Band      Band           `json:"band"`
	// RedScore: some single parameter scored 3; RedParameters names them.
	RedScore      bool     `json:"redScore"`
	RedParameters []string `json:"redParameters,omitempty"`
	// Response is the RCP chart 3 clinical response for Band, e.g.
	// "Urgent ward-based response"; Monitoring is the chart 4 minimum
	// frequency of monitoring.
	Response   string `json:"response"`
	Monitoring string `json:"monitoring"`
	// Recommendations are the chart 4 clinical response for the trigger
	// reached, then notes specific to this patient's scores.
	Recommendations []string `json:"recommendations"`
}

// Severity maps the result onto carehub's workflow severity; see
// NEWS2Severity.
func (r NEWS2Result) Severity() Severity { return NEWS2Severity(r.Band, r.Total) }

// NEWS2Severity maps a NEWS2 band and total onto carehub's workflow
// severity, for callers holding only a stored output's band and score:
//
//	low, total 0        NONE
//	low, total 1–4      LOW
//	low-medium (red)    MEDIUM
//	medium (5–6)        HIGH
//	high (7+)           CRITICAL
//
// Severity sits one level above the RCP band's name because the RCP's
// "medium" is already its urgent-response threshold, which in an alerting
// system is a high-severity alert, and its "high" is the emergency
// threshold. The total also counts on its own (≥ 7 CRITICAL, ≥ 5 HIGH), so an
// unknown or mistyped band cannot lower the severity of a high score.
func NEWS2Severity(band Band, total int) Severity {
	switch {
	case band == BandHigh || total >= 7:
		return SeverityCritical
	case band == BandMedium || total >= 5:
		return SeverityHigh
	case band == BandLowMedium:
		return SeverityMedium
	case total == 0:
		return SeverityNone
	}
	return SeverityLow
}

// Banding rule for values between chart rows. The NEWS2 chart lists integer
// rows (temperature in tenths), so a measured 20.5 breaths/min, 95.5 % or
// 36.05 °C falls between two rows. Such a value takes the row further from
// normal, which is always the higher of the two scores: the score-0 row
// keeps its charted closed interval (respiratory rate 12–20) and every other
// row reaches outward up to the next row (respiratory rate 21–24 becomes
// 20 < x ≤ 24, 9–11 becomes 9 ≤ x < 12). An early-warning score must not
// be falsely reassuring because of recording precision, so the gap is
// resolved toward the alarm. Values on a charted row score exactly as
// charted.

// scoreRespiratoryRate: ≤8 → 3, 9–11 → 1, 12–20 → 0, 21–24 → 2, ≥25 → 3.
func scoreRespiratoryRate(x float64) int {
	switch {
	case x < 9:
		return 3
	case x < 12:
		return 1
	case x <= 20:
		return 0
	case x <= 24:
		return 2
	}
	return 3
}

// scoreSpO2Scale1: ≤91 → 3, 92–93 → 2, 94–95 → 1, ≥96 → 0.
func scoreSpO2Scale1(x float64) int {
	switch {
	case x < 92:
		return 3
	case x < 94:
		return 2
	case x < 96:
		return 1
	}
	return 0
}

// scoreSpO2Scale2: ≤83 → 3, 84–85 → 2, 86–87 → 1, 88–92 → 0, ≥93 on air →
// 0; on oxygen 93–94 → 1, 95–96 → 2, ≥97 → 3 (over-oxygenation risks
// hypercapnia in these patients).
func scoreSpO2Scale2(x float64, onOxygen bool) int {
	switch {
	case x < 84:
		return 3
	case x < 86:
		return 2
	case x < 88:
		return 1
	case x <= 92 || !onOxygen:
		return 0
	case x <= 94:
		return 1
	case x <= 96:
		return 2
	}
	return 3
}

// scoreSystolicBP: ≤90 → 3, 91–100 → 2, 101–110 → 1, 111–219 → 0, ≥220 → 3.
func scoreSystolicBP(x float64) int {
	switch {
	case x < 91:
		return 3
	case x < 101:
		return 2
	case x < 111:
		return 1
	case x <= 219:
		return 0
	}
	return 3
}

// scoreHeartRate: ≤40 → 3, 41–50 → 1, 51–90 → 0, 91–110 → 1, 111–130 → 2,
// ≥131 → 3.
func scoreHeartRate(x float64) int {
	switch {
	case x < 41:
		return 3
	case x < 51:
		return 1
	case x <= 90:
		return 0
	case x <= 110:
		return 1
	case x <= 130:
		return 2
	}
	return 3
}

// scoreTemperature: ≤35.0 → 3, 35.1–36.0 → 1, 36.1–38.0 → 0, 38.1–39.0 → 1,
// ≥39.1 → 2.
func scoreTemperature(x float64) int {
	switch {
	case x < 35.1:
		return 3
	case x < 36.1:
		return 1
	case x <= 38.0:
		return 0
	case x <= 39.0:
		return 1
	}
	return 2
}

// NEWS2 computes the National Early Warning Score 2 (Royal College of
// Physicians, 2017) from v. Every chart parameter is required; when any is
// missing or invalid the error is an *InputError listing all of them and
// the result is the zero value.
func NEWS2(v Vitals) (NEWS2Result, error) {
	c := inputErrors{skill: SkillNEWS2}
	if v.RespiratoryRate == nil {
		c.miss(ParamRespiratoryRate)
	}
	if v.SpO2 == nil {
		c.miss(ParamSpO2)
	}
	if v.OnOxygen == nil {
		c.miss(ParamSupplementalOxygen)
	}
	if v.SystolicBP == nil {
		c.miss(ParamSystolicBP)
	}
	if v.HeartRate == nil {
		c.miss(ParamHeartRate)
	}
	if v.Consciousness == nil && v.GCS == nil {
		c.miss(ParamConsciousness)
	}
	if v.Temperature == nil {
		c.miss(ParamTemperature)
	}
	checkValue(&c, ParamRespiratoryRate, LOINCRespiratoryRate, v.RespiratoryRate)
	checkValue(&c, ParamSpO2, LOINCOxygenSaturation, v.SpO2)
	if v.SpO2Scale != 0 && v.SpO2Scale != SpO2Scale1 && v.SpO2Scale != SpO2Scale2 {
		c.bad(ParamSpO2Scale, "scale %d is not 1 or 2", v.SpO2Scale)
	}
	checkValue(&c, ParamSystolicBP, LOINCSystolicBP, v.SystolicBP)
	checkValue(&c, ParamHeartRate, LOINCHeartRate, v.HeartRate)
	checkConsciousness(&c, v)
	checkValue(&c, ParamTemperature, LOINCBodyTemperature, v.Temperature)
	if err := c.err(); err != nil {
		return NEWS2Result{}, err
	}

	scale := SpO2Scale1
	if v.SpO2Scale == SpO2Scale2 {
		scale = SpO2Scale2
	}
	var s NEWS2Subscores
	s.RespiratoryRate = scoreRespiratoryRate(*v.RespiratoryRate)
	if scale == SpO2Scale2 {
		s.SpO2 = scoreSpO2Scale2(*v.SpO2, *v.OnOxygen)
	} else {
		s.SpO2 = scoreSpO2Scale1(*v.SpO2)
	}
	if *v.OnOxygen {
		s.SupplementalOxygen = 2
	}
	s.SystolicBP = scoreSystolicBP(*v.SystolicBP)
	s.HeartRate = scoreHeartRate(*v.HeartRate)
	if alert, _ := v.alert(); !alert {
		s.Consciousness = 3
	}
	s.Temperature = scoreTemperature(*v.Temperature)

	r := NEWS2Result{Total: s.total(), Subscores: s, SpO2Scale: scale, RedParameters: s.red()}
	r.RedScore = len(r.RedParameters) > 0
	switch {
	case r.Total >= 7:
		r.Band = BandHigh
	case r.Total >= 5:
		r.Band = BandMedium
	case r.RedScore:
		r.Band = BandLowMedium
	default:
		r.Band = BandLow
	}
	r.Response = bandResponse[r.Band]
	t := triggerFor(r)
	r.Monitoring = t.monitoring
	r.Recommendations = append(r.Recommendations, "Monitoring: "+t.monitoring+".")
	r.Recommendations = append(r.Recommendations, t.response...)
	if r.RedScore {
		r.Recommendations = append(r.Recommendations, fmt.Sprintf(
			"Red score: %s scored 3; a single extreme parameter needs review even when the total is low.",
			strings.Join(r.RedParameters, ", ")))
	}
	if r.Total >= 5 {
		r.Recommendations = append(r.Recommendations,
			"If infection is known or suspected, consider sepsis: NEWS2 of 5 or more is the RCP trigger for sepsis screening.")
	}
	if scale == SpO2Scale2 {
		r.Recommendations = append(r.Recommendations,
			"SpO2 scale 2 in use (target 88–92 %): confirm hypercapnic respiratory failure is documented by a competent clinical decision maker.")
	}
	return r, nil
}

// bandResponse is RCP NEWS2 chart 3: clinical risk → clinical response.
var bandResponse = map[Band]string{
	BandLow:       "Ward-based response",
	BandLowMedium: "Urgent ward-based response",
	BandMedium:    "Key threshold for urgent response",
	BandHigh:      "Urgent or emergency response",
}

// trigger is one row of RCP NEWS2 chart 4: clinical response to the NEWS
// trigger thresholds.
type trigger struct {
	monitoring string
	response   []string
}

func triggerFor(r NEWS2Result) trigger {
	switch {
	case r.Total >= 7:
		return trigger{"continuous monitoring of vital signs", []string{
			"Registered nurse to immediately inform the medical team caring for the patient – this should be at least at specialist registrar level.",
			"Emergency assessment by a team with critical care competencies, including practitioner(s) with advanced airway management skills.",
			"Consider transfer of care to a level 2 or 3 clinical care facility, ie higher-dependency unit or ICU.",
			"Clinical care in an environment with monitoring facilities.",
		}}
	case r.Total >= 5:
		return trigger{"minimum 1 hourly", []string{
			"Registered nurse to immediately inform the medical team caring for the patient.",
			"Registered nurse to request urgent assessment by a clinician or team with core competencies in the care of acutely ill patients.",
			"Provide clinical care in an environment with monitoring facilities.",
		}}
	case r.RedScore:
		return trigger{"minimum 1 hourly", []string{
			"Registered nurse to inform medical team caring for the patient, who will review and decide whether escalation of care is necessary.",
		}}
	case r.Total >= 1:
		return trigger{"minimum 4–6 hourly", []string{
			"Inform registered nurse, who must assess the patient.",
			"Registered nurse decides whether increased frequency of monitoring and/or escalation of care is required.",
		}}
	}
	return trigger{"minimum 12 hourly", []string{"Continue routine NEWS monitoring."}}
}

// NEWS2ParameterScore is the NEWS2 chart's score of one observation alone: value of the vital
// sign LOINC code, in the VitalSigns table's unit (SpO2 on scale 1). ok is false for a code the
// chart does not score by value (consciousness, oxygen flow, diastolic pressure, any other). A
// score above 0 is a value outside the chart's normal band: FHIR subscriptions' vital-out-of-range
// topic (processors/fhirsubs).
func NEWS2ParameterScore(code string, value float64) (score int, ok bool) {
	switch code {
	case LOINCRespiratoryRate:
		return scoreRespiratoryRate(value), true
	case LOINCOxygenSaturation:
		return scoreSpO2Scale1(value), true
	case LOINCSystolicBP:
		return scoreSystolicBP(value), true
	case LOINCHeartRate:
		return scoreHeartRate(value), true
	case LOINCBodyTemperature:
		return scoreTemperature(value), true
	}
	return 0, false
}
