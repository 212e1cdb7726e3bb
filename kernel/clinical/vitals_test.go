package clinical

import (
	"errors"
	"testing"
)

func TestLOINCCodes(t *testing.T) {
	// These values are shared with demo data and observation ingest; a
	// change here is a breaking change.
	for got, want := range map[string]string{
		LOINCRespiratoryRate:   "9279-1",
		LOINCOxygenSaturation:  "59408-5",
		LOINCSystolicBP:        "8480-6",
		LOINCDiastolicBP:       "8462-4",
		LOINCHeartRate:         "8867-4",
		LOINCBodyTemperature:   "8310-5",
		LOINCInhaledOxygenFlow: "3151-8",
		LOINCGlasgowComaScore:  "9269-2",
	} {
		if got != want {
			t.Errorf("code %q, want %q", got, want)
		}
	}
}

func TestVitalSignsTable(t *testing.T) {
	units := map[string]string{
		LOINCRespiratoryRate: "/min", LOINCOxygenSaturation: "%", LOINCSystolicBP: "mm[Hg]",
		LOINCDiastolicBP: "mm[Hg]", LOINCHeartRate: "/min", LOINCBodyTemperature: "Cel",
		LOINCInhaledOxygenFlow: "L/min", LOINCGlasgowComaScore: "{score}",
	}
	table := VitalSigns()
	if len(table) != len(units) {
		t.Fatalf("%d vital signs, want %d", len(table), len(units))
	}
	names := map[string]bool{}
	for _, v := range table {
		if units[v.Code] != v.Unit {
			t.Errorf("%s unit %q, want %q", v.Code, v.Unit, units[v.Code])
		}
		if v.Name == "" || v.Display == "" || names[v.Name] {
			t.Errorf("%s: empty or duplicate name %q / display %q", v.Code, v.Name, v.Display)
		}
		names[v.Name] = true
		if !(v.Min < v.Max) || v.TrendTolerance <= 0 {
			t.Errorf("%s: range %v–%v tolerance %v", v.Code, v.Min, v.Max, v.TrendTolerance)
		}
		if got, ok := VitalByCode(v.Code); !ok || got.Code != v.Code {
			t.Errorf("VitalByCode(%s) = %v %v", v.Code, got, ok)
		}
	}
	if gcs, _ := VitalByCode(LOINCGlasgowComaScore); gcs.Min != 3 || gcs.Max != 15 {
		t.Errorf("GCS range %v–%v, want 3–15", gcs.Min, gcs.Max)
	}
	if spo2, _ := VitalByCode(LOINCOxygenSaturation); spo2.Max != 100 {
		t.Errorf("SpO2 max %v, want 100", spo2.Max)
	}
	table[0].Code = "changed"
	if VitalSigns()[0].Code == "changed" {
		t.Error("VitalSigns exposes its backing array")
	}
	if _, ok := VitalByCode("0000-0"); ok {
		t.Error("VitalByCode found an unknown code")
	}
}

func TestNormalize(t *testing.T) {
	for _, tc := range []struct {
		code  string
		value float64
		unit  string
		want  float64
		err   error
	}{
		{LOINCSystolicBP, 120, "mm[Hg]", 120, nil},
		{LOINCSystolicBP, 120, "mmHg", 120, nil},
		{LOINCSystolicBP, 120, "", 120, nil},
		{LOINCHeartRate, 72, "bpm", 72, nil},
		{LOINCBodyTemperature, 37.2, "Cel", 37.2, nil},
		{LOINCBodyTemperature, 98.6, "[degF]", 37, nil},
		// 96.8 °F is exactly 36.0 °C, which scores 1; unrounded float
		// arithmetic would also give 36 here, 97.0 °F gives 36.11 (score 0).
		{LOINCBodyTemperature, 96.8, "°F", 36, nil},
		{LOINCBodyTemperature, 97.0, "[degF]", 36.11, nil},
		{LOINCGlasgowComaScore, 14, "{score}", 14, nil},
		{LOINCInhaledOxygenFlow, 0, "L/min", 0, nil},
		{LOINCBodyTemperature, 310, "K", 0, ErrInvalidInput},
		{LOINCOxygenSaturation, 101, "%", 0, ErrInvalidInput},
		{LOINCBodyTemperature, 98.6, "Cel", 0, ErrInvalidInput}, // °F sent as Cel
		{LOINCGlasgowComaScore, 2, "", 0, ErrInvalidInput},
		{"1234-5", 1, "", 0, ErrUnknownCode},
	} {
		got, err := Normalize(tc.code, tc.value, tc.unit)
		if !errors.Is(err, tc.err) || (tc.err == nil && err != nil) || got != tc.want {
			t.Errorf("Normalize(%s, %v, %q) = %v, %v; want %v, %v", tc.code, tc.value, tc.unit, got, err, tc.want, tc.err)
		}
	}
}
