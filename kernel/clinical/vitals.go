package clinical

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// LOINC codes of the vital signs the skills read. They are the codes of the
// FHIR R4 vital-signs profiles, so observations from devices and EHRs carry
// them unchanged.
const (
	LOINCRespiratoryRate   = "9279-1"  // breaths per minute, /min
	LOINCOxygenSaturation  = "59408-5" // SpO2 by pulse oximetry, %
	LOINCSystolicBP        = "8480-6"  // mm[Hg]
	LOINCDiastolicBP       = "8462-4"  // mm[Hg]
	LOINCHeartRate         = "8867-4"  // beats per minute, /min
	LOINCBodyTemperature   = "8310-5"  // Cel
	LOINCInhaledOxygenFlow = "3151-8"  // L/min; 0 is room air, > 0 supplemental oxygen
	LOINCGlasgowComaScore  = "9269-2"  // total 3–15; 15 is alert, < 15 counts as new confusion
)

// Vital describes one vital sign: how it is coded, its canonical UCUM unit,
// the range of values that is physically possible in a living patient, and
// the change the trend summary treats as real rather than noise.
type Vital struct {
	Code    string `json:"code"`    // LOINC
	Name    string `json:"name"`    // snake_case name used in components and errors
	Display string `json:"display"` // LOINC display name
	Unit    string `json:"unit"`    // canonical UCUM unit

	// Min and Max bound the plausible values, inclusive, in Unit. They are
	// deliberately generous: a value outside them is a device, unit or entry
	// error, not an abnormal patient, and ingest rejects it.
	Min float64 `json:"min"`
	Max float64 `json:"max"`

	// TrendTolerance is the absolute change in Unit, across a trend window,
	// below which the vital is called stable (see Trend).
	TrendTolerance float64 `json:"trendTolerance"`

	// aliases are further spellings of Unit that Normalize accepts as is.
	aliases []string
}

// vitalSigns is the table behind VitalSigns; its order is the order of trend
// components.
var vitalSigns = []Vital{
	{Code: LOINCRespiratoryRate, Name: "respiratory_rate", Display: "Respiratory rate", Unit: "/min",
		Min: 0, Max: 100, TrendTolerance: 2, aliases: []string{"{breaths}/min", "breaths/min", "1/min", "min-1"}},
	{Code: LOINCOxygenSaturation, Name: "spo2", Display: "Oxygen saturation in Arterial blood by Pulse oximetry", Unit: "%",
		Min: 0, Max: 100, TrendTolerance: 2},
	{Code: LOINCSystolicBP, Name: "systolic_bp", Display: "Systolic blood pressure", Unit: "mm[Hg]",
		Min: 0, Max: 300, TrendTolerance: 10, aliases: []string{"mmHg", "mm Hg"}},
	{Code: LOINCDiastolicBP, Name: "diastolic_bp", Display: "Diastolic blood pressure", Unit: "mm[Hg]",
		Min: 0, Max: 200, TrendTolerance: 10, aliases: []string{"mmHg", "mm Hg"}},
	{Code: LOINCHeartRate, Name: "heart_rate", Display: "Heart rate", Unit: "/min",
		Min: 0, Max: 300, TrendTolerance: 10, aliases: []string{"{beats}/min", "beats/min", "bpm", "1/min", "min-1"}},
	{Code: LOINCBodyTemperature, Name: "temperature", Display: "Body temperature", Unit: "Cel",
		Min: 15, Max: 45, TrendTolerance: 0.5, aliases: []string{"°C", "degC"}},
	{Code: LOINCInhaledOxygenFlow, Name: "oxygen_flow", Display: "Inhaled oxygen flow rate", Unit: "L/min",
		Min: 0, Max: 80, TrendTolerance: 1, aliases: []string{"l/min"}},
	{Code: LOINCGlasgowComaScore, Name: "gcs", Display: "Glasgow coma score total", Unit: "{score}",
		Min: 3, Max: 15, TrendTolerance: 1, aliases: []string{"{Score}", "1"}},
}

// VitalSigns returns the table of vital signs carehub understands, in a fixed
// order. The slice is a copy; changing it changes nothing here.
func VitalSigns() []Vital {
	out := make([]Vital, len(vitalSigns))
	copy(out, vitalSigns)
	return out
}

// VitalByCode returns the vital sign with the given LOINC code.
func VitalByCode(code string) (Vital, bool) {
	for _, v := range vitalSigns {
		if v.Code == code {
			return v, true
		}
	}
	return Vital{}, false
}

// Plausible reports whether x, in the canonical unit, lies in [Min, Max].
func (v Vital) Plausible(x float64) bool {
	return !math.IsNaN(x) && !math.IsInf(x, 0) && x >= v.Min && x <= v.Max
}

// Normalize converts value from unit to the canonical unit of the vital with
// the given LOINC code and checks that the result is plausible. An empty unit
// means the canonical one. Fahrenheit ([degF], °F) converts to Cel and is
// rounded to 0.01 °C, so that 96.8 [degF] is 36 Cel and not 35.99999…, which
// matters at the NEWS2 band edges.
//
// The error wraps ErrUnknownCode for a code outside VitalSigns and
// ErrInvalidInput for a unit that does not fit the code or an implausible
// value.
func Normalize(code string, value float64, unit string) (float64, error) {
	v, ok := VitalByCode(code)
	if !ok {
		return 0, fmt.Errorf("normalize %q: %w", code, ErrUnknownCode)
	}
	x, reason := v.normalize(value, unit)
	if reason != "" {
		return 0, fmt.Errorf("%s: %s: %w", v.Name, reason, ErrInvalidInput)
	}
	return x, nil
}

// normalize is Normalize for a known vital; a non-empty reason says why the
// value is unusable.
func (v Vital) normalize(value float64, unit string) (x float64, reason string) {
	u := strings.TrimSpace(unit)
	switch {
	case u == "" || u == v.Unit || slices.Contains(v.aliases, u):
		x = value
	case v.Code == LOINCBodyTemperature && (u == "[degF]" || u == "°F" || u == "degF"):
		x = math.Round((value-32)*5/9*100) / 100
	default:
		return 0, fmt.Sprintf("unit %q, want %q", unit, v.Unit)
	}
	if !v.Plausible(x) {
		return 0, fmt.Sprintf("%v %s outside plausible range %v–%v", x, v.Unit, v.Min, v.Max)
	}
	return x, ""
}
