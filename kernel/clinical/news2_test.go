package clinical

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

// paramCase sets one parameter on otherwise normal vitals and expects that
// parameter's sub-score. Rows marked "gap" are values between two chart rows,
// which score the higher of the two (see the banding rule in news2.go).
type paramCase struct {
	x    float64
	want int
}

func runParamCases(t *testing.T, name string, cases []paramCase, set func(*Vitals, float64), got func(NEWS2Subscores) int, extra int) {
	t.Helper()
	for _, c := range cases {
		t.Run(name+"/"+num(c.x), func(t *testing.T) {
			v := normal()
			set(&v, c.x)
			r := mustNEWS2(t, v)
			if g := got(r.Subscores); g != c.want {
				t.Errorf("%s %v: sub-score %d, want %d", name, c.x, g, c.want)
			}
			// The other parameters are normal, so the total is this
			// parameter's score plus any fixed extra (oxygen).
			if r.Total != c.want+extra {
				t.Errorf("%s %v: total %d, want %d", name, c.x, r.Total, c.want+extra)
			}
		})
	}
}

func TestNEWS2RespiratoryRate(t *testing.T) {
	runParamCases(t, "rr", []paramCase{
		{0, 3}, {8, 3}, {8.5, 3 /* gap */}, {8.99, 3 /* gap */},
		{9, 1}, {11, 1}, {11.5, 1 /* gap */},
		{12, 0}, {16, 0}, {20, 0},
		{20.5, 2 /* gap */}, {21, 2}, {24, 2},
		{24.5, 3 /* gap */}, {25, 3}, {60, 3},
	}, func(v *Vitals, x float64) { v.RespiratoryRate = f(x) },
		func(s NEWS2Subscores) int { return s.RespiratoryRate }, 0)
}

func TestNEWS2SpO2Scale1(t *testing.T) {
	cases := []paramCase{
		{50, 3}, {91, 3}, {91.5, 3 /* gap */},
		{92, 2}, {93, 2}, {93.5, 2 /* gap */},
		{94, 1}, {95, 1}, {95.5, 1 /* gap */},
		{96, 0}, {100, 0},
	}
	set := func(v *Vitals, x float64) { v.SpO2 = f(x) }
	get := func(s NEWS2Subscores) int { return s.SpO2 }
	runParamCases(t, "scale1-air", cases, set, get, 0)
	// Scale 1 does not depend on oxygen; oxygen scores its own 2.
	runParamCases(t, "scale1-oxygen", cases, func(v *Vitals, x float64) { set(v, x); v.OnOxygen = b(true) }, get, 2)
	// Explicit scale 1 is the same as the zero value.
	runParamCases(t, "scale1-explicit", cases, func(v *Vitals, x float64) { set(v, x); v.SpO2Scale = SpO2Scale1 }, get, 0)
}

func TestNEWS2SpO2Scale2(t *testing.T) {
	low := []paramCase{
		{70, 3}, {83, 3}, {83.5, 3 /* gap */},
		{84, 2}, {85, 2}, {85.5, 2 /* gap */},
		{86, 1}, {87, 1}, {87.5, 1 /* gap */},
		{88, 0}, {90, 0}, {92, 0},
	}
	onAir := append(append([]paramCase{}, low...),
		paramCase{92.5, 0}, paramCase{93, 0}, paramCase{95, 0}, paramCase{97, 0}, paramCase{100, 0})
	onOxygen := append(append([]paramCase{}, low...),
		paramCase{92.5, 1 /* gap */}, paramCase{93, 1}, paramCase{94, 1},
		paramCase{94.5, 2 /* gap */}, paramCase{95, 2}, paramCase{96, 2},
		paramCase{96.5, 3 /* gap */}, paramCase{97, 3}, paramCase{100, 3})
	get := func(s NEWS2Subscores) int { return s.SpO2 }
	runParamCases(t, "scale2-air", onAir,
		func(v *Vitals, x float64) { v.SpO2 = f(x); v.SpO2Scale = SpO2Scale2 }, get, 0)
	runParamCases(t, "scale2-oxygen", onOxygen,
		func(v *Vitals, x float64) { v.SpO2 = f(x); v.SpO2Scale = SpO2Scale2; v.OnOxygen = b(true) }, get, 2)
}

func TestNEWS2AirOrOxygen(t *testing.T) {
	for _, tc := range []struct {
		on   bool
		want int
	}{{false, 0}, {true, 2}} {
		v := normal()
		v.OnOxygen = b(tc.on)
		r := mustNEWS2(t, v)
		if r.Subscores.SupplementalOxygen != tc.want || r.Total != tc.want {
			t.Errorf("oxygen %v: sub-score %d total %d, want %d", tc.on, r.Subscores.SupplementalOxygen, r.Total, tc.want)
		}
	}
}

func TestNEWS2SystolicBP(t *testing.T) {
	runParamCases(t, "sbp", []paramCase{
		{40, 3}, {90, 3}, {90.5, 3 /* gap */},
		{91, 2}, {100, 2}, {100.5, 2 /* gap */},
		{101, 1}, {110, 1}, {110.5, 1 /* gap */},
		{111, 0}, {150, 0}, {219, 0},
		{219.5, 3 /* gap */}, {220, 3}, {280, 3},
	}, func(v *Vitals, x float64) { v.SystolicBP = f(x) },
		func(s NEWS2Subscores) int { return s.SystolicBP }, 0)
}

func TestNEWS2HeartRate(t *testing.T) {
	runParamCases(t, "hr", []paramCase{
		{20, 3}, {40, 3}, {40.5, 3 /* gap */},
		{41, 1}, {50, 1}, {50.5, 1 /* gap */},
		{51, 0}, {90, 0},
		{90.5, 1 /* gap */}, {91, 1}, {110, 1},
		{110.5, 2 /* gap */}, {111, 2}, {130, 2},
		{130.5, 3 /* gap */}, {131, 3}, {200, 3},
	}, func(v *Vitals, x float64) { v.HeartRate = f(x) },
		func(s NEWS2Subscores) int { return s.HeartRate }, 0)
}

func TestNEWS2Temperature(t *testing.T) {
	runParamCases(t, "temp", []paramCase{
		{30, 3}, {35.0, 3}, {35.05, 3 /* gap */},
		{35.1, 1}, {35.5, 1}, {36.0, 1}, {36.05, 1 /* gap */},
		{36.1, 0}, {37, 0}, {38.0, 0},
		{38.05, 1 /* gap */}, {38.1, 1}, {39.0, 1},
		{39.05, 2 /* gap */}, {39.1, 2}, {42, 2},
	}, func(v *Vitals, x float64) { v.Temperature = f(x) },
		func(s NEWS2Subscores) int { return s.Temperature }, 0)
}

func TestNEWS2Consciousness(t *testing.T) {
	for _, tc := range []struct {
		name  string
		level *Consciousness
		gcs   *float64
		want  int
	}{
		{"A", lvl(Alert), nil, 0},
		{"C", lvl(Confusion), nil, 3},
		{"V", lvl(Voice), nil, 3},
		{"P", lvl(Pain), nil, 3},
		{"U", lvl(Unresponsive), nil, 3},
		{"GCS 15", nil, f(15), 0},
		{"GCS 14", nil, f(14), 3},
		{"GCS 3", nil, f(3), 3},
		// Both given: the worse wins.
		{"A with GCS 15", lvl(Alert), f(15), 0},
		{"A with GCS 14", lvl(Alert), f(14), 3},
		{"C with GCS 15", lvl(Confusion), f(15), 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := normal()
			v.Consciousness, v.GCS = tc.level, tc.gcs
			r := mustNEWS2(t, v)
			if r.Subscores.Consciousness != tc.want || r.Total != tc.want {
				t.Errorf("sub-score %d total %d, want %d", r.Subscores.Consciousness, r.Total, tc.want)
			}
			if r.RedScore != (tc.want == 3) {
				t.Errorf("red score %v, want %v", r.RedScore, tc.want == 3)
			}
		})
	}
}

// TestNEWS2GapRule checks the banding rule for values between chart rows over
// the whole chart: a value strictly between two adjacent charted values a < b
// scores max(score(a), score(b)), and charted values score as charted.
func TestNEWS2GapRule(t *testing.T) {
	for _, p := range []struct {
		name       string
		lo, hi, dx float64 // charted values lo, lo+dx, …, hi
		score      func(float64) int
	}{
		{"rr", 0, 60, 1, scoreRespiratoryRate},
		{"spo2-1", 70, 100, 1, scoreSpO2Scale1},
		{"spo2-2-air", 70, 100, 1, func(x float64) int { return scoreSpO2Scale2(x, false) }},
		{"spo2-2-oxygen", 70, 100, 1, func(x float64) int { return scoreSpO2Scale2(x, true) }},
		{"sbp", 50, 260, 1, scoreSystolicBP},
		{"hr", 20, 200, 1, scoreHeartRate},
		{"temp", 33, 42, 0.1, scoreTemperature},
	} {
		t.Run(p.name, func(t *testing.T) {
			steps := int(math.Round((p.hi - p.lo) / p.dx))
			for i := 0; i < steps; i++ {
				// Charted values are built by rounding so 36.1 is the same
				// float64 a caller would pass.
				a := math.Round((p.lo+float64(i)*p.dx)*10) / 10
				bb := math.Round((p.lo+float64(i+1)*p.dx)*10) / 10
				want := max(p.score(a), p.score(bb))
				for _, frac := range []float64{0.01, 0.5, 0.99} {
					x := a + frac*(bb-a)
					if got := p.score(x); got != want {
						t.Errorf("%s(%v) = %d, want %d (between %v→%d and %v→%d)", p.name, x, got, want, a, p.score(a), bb, p.score(bb))
					}
				}
			}
		})
	}
}

func TestNEWS2Bands(t *testing.T) {
	for _, tc := range []struct {
		name       string
		set        func(*Vitals)
		total      int
		band       Band
		red        bool
		severity   Severity
		response   string
		monitoring string
	}{
		{"0 is low, no severity", func(v *Vitals) {}, 0, BandLow, false, SeverityNone,
			"Ward-based response", "minimum 12 hourly"},
		{"1 is low", func(v *Vitals) { v.HeartRate = f(95) }, 1, BandLow, false, SeverityLow,
			"Ward-based response", "minimum 4–6 hourly"},
		// RR 22 → 2, HR 95 → 1, temperature 38.5 → 1: 4, no red.
		{"4 without red is low", func(v *Vitals) { v.RespiratoryRate = f(22); v.HeartRate = f(95); v.Temperature = f(38.5) },
			4, BandLow, false, SeverityLow, "Ward-based response", "minimum 4–6 hourly"},
		{"single 3 is low-medium", func(v *Vitals) { v.Consciousness = lvl(Confusion) }, 3, BandLowMedium, true, SeverityMedium,
			"Urgent ward-based response", "minimum 1 hourly"},
		// Temperature 34.8 → 3, HR 95 → 1: 4 with a red score.
		{"4 with red is low-medium", func(v *Vitals) { v.Temperature = f(34.8); v.HeartRate = f(95) }, 4, BandLowMedium, true, SeverityMedium,
			"Urgent ward-based response", "minimum 1 hourly"},
		// SBP 88 → 3, HR 115 → 2: 5; the aggregate outranks the red score.
		{"5 with red is medium", func(v *Vitals) { v.SystolicBP = f(88); v.HeartRate = f(115) }, 5, BandMedium, true, SeverityHigh,
			"Key threshold for urgent response", "minimum 1 hourly"},
		// RR 22 → 2, SpO2 95 → 1, SBP 105 → 1, HR 105 → 1: 5, no red.
		{"5 is medium", func(v *Vitals) {
			v.RespiratoryRate = f(22)
			v.SpO2 = f(95)
			v.SystolicBP = f(105)
			v.HeartRate = f(105)
		},
			5, BandMedium, false, SeverityHigh, "Key threshold for urgent response", "minimum 1 hourly"},
		// RR 22 → 2, oxygen → 2, HR 115 → 2: 6.
		{"6 is medium", func(v *Vitals) { v.RespiratoryRate = f(22); v.OnOxygen = b(true); v.HeartRate = f(115) },
			6, BandMedium, false, SeverityHigh, "Key threshold for urgent response", "minimum 1 hourly"},
		// RR 22 → 2, oxygen → 2, HR 115 → 2, temperature 38.5 → 1: 7.
		{"7 is high", func(v *Vitals) {
			v.RespiratoryRate = f(22)
			v.OnOxygen = b(true)
			v.HeartRate = f(115)
			v.Temperature = f(38.5)
		},
			7, BandHigh, false, SeverityCritical, "Urgent or emergency response", "continuous monitoring of vital signs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := normal()
			tc.set(&v)
			r := mustNEWS2(t, v)
			if r.Total != tc.total || r.Band != tc.band || r.RedScore != tc.red || r.Severity() != tc.severity {
				t.Errorf("got total %d band %s red %v severity %s, want %d %s %v %s",
					r.Total, r.Band, r.RedScore, r.Severity(), tc.total, tc.band, tc.red, tc.severity)
			}
			if r.Response != tc.response || r.Monitoring != tc.monitoring {
				t.Errorf("response %q monitoring %q, want %q %q", r.Response, r.Monitoring, tc.response, tc.monitoring)
			}
			if len(r.Recommendations) < 2 || r.Recommendations[0] != "Monitoring: "+tc.monitoring+"." {
				t.Errorf("recommendations %q do not start with the monitoring frequency", r.Recommendations)
			}
		})
	}
}

// TestNEWS2Examples are hand-computed cases; the calculation is written out
// against RCP NEWS2 chart 1.
func TestNEWS2Examples(t *testing.T) {
	for _, tc := range []struct {
		name  string
		v     Vitals
		want  NEWS2Subscores
		total int // the hand total from the comment
		band  Band
	}{
		{
			// Post-operative patient, well: every parameter in its 0 row.
			// RR 14 (12–20) 0, SpO2 97 scale 1 (≥96) 0, air 0, SBP 128
			// (111–219) 0, pulse 78 (51–90) 0, Alert 0, 36.8 °C
			// (36.1–38.0) 0. Total 0, low.
			name:  "well",
			v:     Vitals{RespiratoryRate: f(14), SpO2: f(97), OnOxygen: b(false), SystolicBP: f(128), HeartRate: f(78), GCS: f(15), Temperature: f(36.8)},
			want:  NEWS2Subscores{},
			total: 0,
			band:  BandLow,
		},
		{
			// Community-acquired pneumonia: RR 24 (21–24) 2, SpO2 93 scale
			// 1 (92–93) 2, on oxygen 2, SBP 104 (101–110) 1, pulse 112
			// (111–130) 2, Alert 0, 38.9 °C (38.1–39.0) 1.
			// Total 2+2+2+1+2+0+1 = 10, high.
			name:  "pneumonia",
			v:     Vitals{RespiratoryRate: f(24), SpO2: f(93), OnOxygen: b(true), SystolicBP: f(104), HeartRate: f(112), Consciousness: lvl(Alert), Temperature: f(38.9)},
			want:  NEWS2Subscores{RespiratoryRate: 2, SpO2: 2, SupplementalOxygen: 2, SystolicBP: 1, HeartRate: 2, Temperature: 1},
			total: 10,
			band:  BandHigh,
		},
		{
			// COPD with hypercapnic respiratory failure on scale 2, target
			// 88–92 %: RR 20 (12–20) 0, SpO2 90 on oxygen (88–92) 0, oxygen
			// 2, SBP 132 0, pulse 96 (91–110) 1, Alert 0, 37.4 °C 0.
			// Total 0+0+2+0+1+0+0 = 3, low (no single 3).
			name:  "COPD on scale 2",
			v:     Vitals{RespiratoryRate: f(20), SpO2: f(90), SpO2Scale: SpO2Scale2, OnOxygen: b(true), SystolicBP: f(132), HeartRate: f(96), Consciousness: lvl(Alert), Temperature: f(37.4)},
			want:  NEWS2Subscores{SupplementalOxygen: 2, HeartRate: 1},
			total: 3,
			band:  BandLow,
		},
		{
			// The same patient wrongly scored on scale 1: SpO2 90 (≤91) 3,
			// so total 0+3+2+0+1+0+0 = 6, medium: why the scale matters.
			name:  "COPD on scale 1",
			v:     Vitals{RespiratoryRate: f(20), SpO2: f(90), OnOxygen: b(true), SystolicBP: f(132), HeartRate: f(96), Consciousness: lvl(Alert), Temperature: f(37.4)},
			want:  NEWS2Subscores{SpO2: 3, SupplementalOxygen: 2, HeartRate: 1},
			total: 6,
			band:  BandMedium,
		},
		{
			// Elderly patient with new confusion (GCS 14) and otherwise
			// borderline vitals: RR 20 0, SpO2 96 0, air 0, SBP 112 0, pulse
			// 90 0, GCS 14 → not alert 3, 36.1 °C 0. Total 3, red score,
			// low-medium.
			name:  "new confusion",
			v:     Vitals{RespiratoryRate: f(20), SpO2: f(96), OnOxygen: b(false), SystolicBP: f(112), HeartRate: f(90), GCS: f(14), Temperature: f(36.1)},
			want:  NEWS2Subscores{Consciousness: 3},
			total: 3,
			band:  BandLowMedium,
		},
		{
			// Worst case on every row: RR 30 3, SpO2 85 scale 1 3, oxygen 2,
			// SBP 80 3, pulse 140 3, Unresponsive 3, 34.0 °C 3. Total 20,
			// the NEWS2 maximum.
			name:  "maximum",
			v:     Vitals{RespiratoryRate: f(30), SpO2: f(85), OnOxygen: b(true), SystolicBP: f(80), HeartRate: f(140), Consciousness: lvl(Unresponsive), Temperature: f(34)},
			want:  NEWS2Subscores{RespiratoryRate: 3, SpO2: 3, SupplementalOxygen: 2, SystolicBP: 3, HeartRate: 3, Consciousness: 3, Temperature: 3},
			total: 20,
			band:  BandHigh,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustNEWS2(t, tc.v)
			if r.Subscores != tc.want {
				t.Errorf("sub-scores %+v, want %+v", r.Subscores, tc.want)
			}
			if r.Total != tc.total || r.Band != tc.band {
				t.Errorf("total %d band %s, want %d %s", r.Total, r.Band, tc.total, tc.band)
			}
		})
	}
}

func TestNEWS2RedParametersAndRecommendations(t *testing.T) {
	v := normal()
	v.SystolicBP = f(85)
	v.Temperature = f(34.5)
	r := mustNEWS2(t, v)
	if want := []string{ParamSystolicBP, ParamTemperature}; !reflect.DeepEqual(r.RedParameters, want) {
		t.Errorf("red parameters %v, want %v", r.RedParameters, want)
	}
	joined := strings.Join(r.Recommendations, "\n")
	for _, want := range []string{"systolic_bp, temperature scored 3", "consider sepsis", "Registered nurse to immediately inform the medical team"} {
		if !strings.Contains(joined, want) {
			t.Errorf("recommendations lack %q:\n%s", want, joined)
		}
	}
	v = normal()
	v.SpO2Scale = SpO2Scale2
	r = mustNEWS2(t, v)
	if r.SpO2Scale != 2 || !strings.Contains(strings.Join(r.Recommendations, "\n"), "scale 2") {
		t.Errorf("scale 2 not reported: %d %q", r.SpO2Scale, r.Recommendations)
	}
	if r = mustNEWS2(t, normal()); r.SpO2Scale != 1 || len(r.RedParameters) != 0 {
		t.Errorf("defaults: scale %d red %v", r.SpO2Scale, r.RedParameters)
	}
}

func TestNEWS2InputErrors(t *testing.T) {
	for _, tc := range []struct {
		name        string
		v           Vitals
		missing     []string
		invalid     []string
		isMissing   bool
		isInvalid   bool
		messagePart string
	}{
		{"nothing", Vitals{}, []string{ParamRespiratoryRate, ParamSpO2, ParamSupplementalOxygen, ParamSystolicBP,
			ParamHeartRate, ParamConsciousness, ParamTemperature}, nil, true, false,
			"news2: missing respiratory_rate, spo2, supplemental_oxygen, systolic_bp, heart_rate, consciousness, temperature"},
		{"oxygen unknown", func() Vitals { v := normal(); v.OnOxygen = nil; return v }(),
			[]string{ParamSupplementalOxygen}, nil, true, false, "missing supplemental_oxygen"},
		{"no consciousness or GCS", func() Vitals { v := normal(); v.Consciousness = nil; return v }(),
			[]string{ParamConsciousness}, nil, true, false, "missing consciousness"},
		{"two missing", func() Vitals { v := normal(); v.HeartRate = nil; v.Temperature = nil; return v }(),
			[]string{ParamHeartRate, ParamTemperature}, nil, true, false, "missing heart_rate, temperature"},
		{"SpO2 above 100", func() Vitals { v := normal(); v.SpO2 = f(104); return v }(),
			nil, []string{ParamSpO2}, false, true, "invalid spo2"},
		{"negative RR", func() Vitals { v := normal(); v.RespiratoryRate = f(-1); return v }(),
			nil, []string{ParamRespiratoryRate}, false, true, "invalid respiratory_rate"},
		{"NaN temperature", func() Vitals { v := normal(); v.Temperature = f(math.NaN()); return v }(),
			nil, []string{ParamTemperature}, false, true, "invalid temperature"},
		{"scale 3", func() Vitals { v := normal(); v.SpO2Scale = 3; return v }(),
			nil, []string{ParamSpO2Scale}, false, true, "scale 3 is not 1 or 2"},
		{"GCS 16", func() Vitals { v := normal(); v.GCS = f(16); return v }(),
			nil, []string{ParamConsciousness}, false, true, "GCS 16"},
		{"GCS 14.5", func() Vitals { v := normal(); v.GCS = f(14.5); return v }(),
			nil, []string{ParamConsciousness}, false, true, "GCS 14.5"},
		{"unknown level", func() Vitals { v := normal(); v.Consciousness = lvl("X"); return v }(),
			nil, []string{ParamConsciousness}, false, true, `level "X"`},
		{"missing and invalid", func() Vitals { v := normal(); v.HeartRate = nil; v.SystolicBP = f(400); return v }(),
			[]string{ParamHeartRate}, []string{ParamSystolicBP}, true, true, "missing heart_rate; invalid systolic_bp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NEWS2(tc.v)
			if err == nil {
				t.Fatalf("no error; result %+v", r)
			}
			if !reflect.DeepEqual(r, NEWS2Result{}) {
				t.Errorf("a result came with the error: %+v", r)
			}
			var ie *InputError
			if !errors.As(err, &ie) {
				t.Fatalf("error %T %v is not *InputError", err, err)
			}
			if ie.Skill != SkillNEWS2 || !reflect.DeepEqual(ie.Missing, tc.missing) {
				t.Errorf("skill %q missing %v, want news2 %v", ie.Skill, ie.Missing, tc.missing)
			}
			var invalid []string
			for _, iv := range ie.Invalid {
				invalid = append(invalid, iv.Parameter)
			}
			if !reflect.DeepEqual(invalid, tc.invalid) {
				t.Errorf("invalid %v, want %v", invalid, tc.invalid)
			}
			if errors.Is(err, ErrMissingInput) != tc.isMissing || errors.Is(err, ErrInvalidInput) != tc.isInvalid {
				t.Errorf("errors.Is missing=%v invalid=%v, want %v %v",
					errors.Is(err, ErrMissingInput), errors.Is(err, ErrInvalidInput), tc.isMissing, tc.isInvalid)
			}
			if !strings.Contains(err.Error(), tc.messagePart) {
				t.Errorf("message %q lacks %q", err.Error(), tc.messagePart)
			}
		})
	}
}

func TestParseConsciousness(t *testing.T) {
	for in, want := range map[string]Consciousness{
		"A": Alert, "alert": Alert, " Alert ": Alert, "c": Confusion, "new confusion": Confusion,
		"V": Voice, "pain": Pain, "U": Unresponsive, "unresponsive": Unresponsive,
	} {
		if got, ok := ParseConsciousness(in); !ok || got != want {
			t.Errorf("ParseConsciousness(%q) = %q %v, want %q", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "X", "asleep"} {
		if got, ok := ParseConsciousness(in); ok {
			t.Errorf("ParseConsciousness(%q) = %q, want failure", in, got)
		}
	}
}

func BenchmarkNEWS2(b *testing.B) {
	v := Vitals{RespiratoryRate: f(24), SpO2: f(93), OnOxygen: new(true), SystolicBP: f(104), HeartRate: f(112), Consciousness: lvl(Alert), Temperature: f(38.9)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NEWS2(v); err != nil {
			b.Fatal(err)
		}
	}
}
