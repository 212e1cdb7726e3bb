package clinical

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

func obs(id, code string, value float64, unit string, h float64) Observation {
	return Observation{ID: id, Code: code, Value: value, Unit: unit, EffectiveAt: at(h)}
}

// ward is a pneumonia patient's chart: an older, normal set at 0 h and the
// latest set at 4 h, some in non-canonical units.
func ward() []Observation {
	return []Observation{
		obs("obs_rr0", LOINCRespiratoryRate, 16, "/min", 0),
		obs("obs_rr1", LOINCRespiratoryRate, 24, "/min", 4),
		obs("obs_sp0", LOINCOxygenSaturation, 97, "%", 0),
		obs("obs_sp1", LOINCOxygenSaturation, 93, "%", 4),
		obs("obs_o21", LOINCInhaledOxygenFlow, 2, "L/min", 4),
		obs("obs_bp0", LOINCSystolicBP, 128, "mmHg", 0),
		obs("obs_bp1", LOINCSystolicBP, 104, "mmHg", 4),
		obs("obs_db1", LOINCDiastolicBP, 62, "mm[Hg]", 4),
		obs("obs_hr0", LOINCHeartRate, 78, "/min", 0),
		obs("obs_hr1", LOINCHeartRate, 112, "/min", 4),
		obs("obs_gc1", LOINCGlasgowComaScore, 15, "{score}", 4),
		obs("obs_t0", LOINCBodyTemperature, 98.2, "[degF]", 0),
		obs("obs_t1", LOINCBodyTemperature, 102.0, "[degF]", 4), // 38.89 °C
	}
}

func run(t *testing.T, name string, in Input) Output {
	t.Helper()
	s, ok := Lookup(name)
	if !ok {
		t.Fatalf("no skill %q", name)
	}
	out, err := s.Run(in)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return out
}

func TestRegistry(t *testing.T) {
	if got, want := Names(), []string{"news2", "qsofa", "vitals_trend"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Names() = %v, want %v", got, want)
	}
	for _, n := range Names() {
		s, ok := Lookup(n)
		if !ok || s.Name() != n {
			t.Errorf("Lookup(%q) = %v %v", n, s, ok)
			continue
		}
		if len(s.Codes()) == 0 {
			t.Errorf("%s reads no codes", n)
		}
		for _, c := range s.Codes() {
			if _, ok := VitalByCode(c); !ok {
				t.Errorf("%s reads %s, which is not in VitalSigns", n, c)
			}
		}
	}
	for _, n := range []string{"NEWS2", "sofa", ""} {
		if _, ok := Lookup(n); ok {
			t.Errorf("Lookup(%q) found a skill", n)
		}
	}
}

func TestNewInputLatest(t *testing.T) {
	in := NewInput([]Observation{
		obs("obs_b", LOINCHeartRate, 90, "/min", 1),
		obs("obs_a", LOINCHeartRate, 80, "/min", 1), // same instant, smaller id
		obs("obs_c", LOINCHeartRate, 70, "/min", 0),
	}, Options{})
	if got := in.Latest[LOINCHeartRate].ID; got != "obs_b" {
		t.Errorf("latest %s, want obs_b (tie broken by larger id)", got)
	}
	if len(in.Series[LOINCHeartRate]) != 3 {
		t.Errorf("series has %d points, want 3", len(in.Series[LOINCHeartRate]))
	}
}

func TestNEWS2Skill(t *testing.T) {
	out := run(t, SkillNEWS2, NewInput(ward(), Options{}))
	// Latest set: RR 24 → 2, SpO2 93 scale 1 → 2, 2 L/min oxygen → 2,
	// SBP 104 → 1, HR 112 → 2, GCS 15 → 0, 102.0 °F = 38.89 °C → 1: 10.
	if out.Score == nil || *out.Score != 10 || out.Band != "high" || out.Severity != SeverityCritical {
		t.Fatalf("score %v band %s severity %s, want 10 high CRITICAL", deref2(out.Score), out.Band, out.Severity)
	}
	wantScores := map[string]int{ParamRespiratoryRate: 2, ParamSpO2: 2, ParamSupplementalOxygen: 2,
		ParamSystolicBP: 1, ParamHeartRate: 2, ParamConsciousness: 0, ParamTemperature: 1}
	for _, c := range out.Components {
		if c.Score == nil || *c.Score != wantScores[c.Name] {
			t.Errorf("component %s score %v, want %d", c.Name, deref2(c.Score), wantScores[c.Name])
		}
	}
	if len(out.Components) != len(wantScores) {
		t.Errorf("%d components, want %d", len(out.Components), len(wantScores))
	}
	// The latest observations only, in component order; diastolic BP is not
	// a NEWS2 parameter.
	want := []string{"obs_rr1", "obs_sp1", "obs_o21", "obs_bp1", "obs_hr1", "obs_gc1", "obs_t1"}
	if !reflect.DeepEqual(out.ObservationIDs, want) {
		t.Errorf("observation ids %v, want %v", out.ObservationIDs, want)
	}
	if temp := out.Components[6]; temp.Unit != "Cel" || *temp.Value != 38.89 {
		t.Errorf("temperature component %v %s, want 38.89 Cel", *temp.Value, temp.Unit)
	}
	if bp := out.Components[3]; bp.Unit != "mm[Hg]" {
		t.Errorf("systolic unit %q, want the canonical mm[Hg]", bp.Unit)
	}
}

func deref2(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestNEWS2SkillOptions(t *testing.T) {
	// Room air by option overrides the 2 L/min flow observation, which is
	// then not among the ids used; confusion by option overrides GCS 15.
	out := run(t, SkillNEWS2, NewInput(ward(), Options{OnOxygen: new(false), Consciousness: Confusion}))
	// 10 − 2 (air) + 3 (confusion) = 11.
	if *out.Score != 11 {
		t.Errorf("score %d, want 11", *out.Score)
	}
	if oxy := out.Components[2]; oxy.Text != "air (option)" || oxy.ObservationID != "" || *oxy.Score != 0 {
		t.Errorf("oxygen component %+v", oxy)
	}
	for _, id := range out.ObservationIDs {
		if id == "obs_o21" {
			t.Error("overridden oxygen flow observation listed as used")
		}
	}
	// Scale 2 on oxygen: SpO2 93 → 1 instead of 2.
	out = run(t, SkillNEWS2, NewInput(ward(), Options{SpO2Scale: 2}))
	if *out.Score != 9 || out.SpO2Scale != 2 || out.Components[1].Text != "scale 2" {
		t.Errorf("scale 2: score %d scale %d text %q, want 9 2 \"scale 2\"", *out.Score, out.SpO2Scale, out.Components[1].Text)
	}
	// Zero flow is room air.
	chart := append(ward(), obs("obs_o22", LOINCInhaledOxygenFlow, 0, "L/min", 5))
	out = run(t, SkillNEWS2, NewInput(chart, Options{}))
	if *out.Score != 8 || out.Components[2].Text != "air" || out.Components[2].ObservationID != "obs_o22" {
		t.Errorf("zero flow: score %d component %+v, want 8 from air", *out.Score, out.Components[2])
	}
}

func TestSkillInputErrors(t *testing.T) {
	partial := []Observation{
		obs("obs_rr", LOINCRespiratoryRate, 18, "/min", 0),
		obs("obs_bp", LOINCSystolicBP, 120, "mmHg", 0),
		obs("obs_t", LOINCBodyTemperature, 310, "K", 0), // wrong unit: invalid, not missing
	}
	for _, tc := range []struct {
		skill   string
		missing []string
		invalid []string
	}{
		{SkillNEWS2, []string{ParamSpO2, ParamSupplementalOxygen, ParamHeartRate, ParamConsciousness}, []string{ParamTemperature}},
		{SkillQSOFA, []string{ParamConsciousness}, nil},
		{SkillVitalsTrend, nil, []string{ParamTemperature}},
	} {
		t.Run(tc.skill, func(t *testing.T) {
			s, _ := Lookup(tc.skill)
			out, err := s.Run(NewInput(partial, Options{}))
			var ie *InputError
			if !errors.As(err, &ie) {
				t.Fatalf("error %v, want *InputError; output %+v", err, out)
			}
			var invalid []string
			for _, iv := range ie.Invalid {
				invalid = append(invalid, iv.Parameter)
			}
			if ie.Skill != tc.skill || !reflect.DeepEqual(ie.Missing, tc.missing) || !reflect.DeepEqual(invalid, tc.invalid) {
				t.Errorf("skill %s missing %v invalid %v, want %s %v %v", ie.Skill, ie.Missing, invalid, tc.skill, tc.missing, tc.invalid)
			}
			if !reflect.DeepEqual(out, Output{}) {
				t.Errorf("output alongside error: %+v", out)
			}
		})
	}
	// No observations at all: the trend has nothing to summarize.
	s, _ := Lookup(SkillVitalsTrend)
	if _, err := s.Run(NewInput(nil, Options{})); !errors.Is(err, ErrMissingInput) || !strings.Contains(err.Error(), "vital_signs") {
		t.Errorf("empty trend: %v", err)
	}
}

func TestQSOFASkill(t *testing.T) {
	out := run(t, SkillQSOFA, NewInput(ward(), Options{}))
	// RR 24 ≥ 22 met, SBP 104 not, GCS 15 not: 1, negative.
	if *out.Score != 1 || out.Band != "negative" || *out.Positive || out.Severity != SeverityLow {
		t.Errorf("score %d band %s positive %v severity %s, want 1 negative false LOW", *out.Score, out.Band, *out.Positive, out.Severity)
	}
	if want := []string{"obs_rr1", "obs_bp1", "obs_gc1"}; !reflect.DeepEqual(out.ObservationIDs, want) {
		t.Errorf("ids %v, want %v", out.ObservationIDs, want)
	}
	met := []bool{*out.Components[0].Met, *out.Components[1].Met, *out.Components[2].Met}
	if !reflect.DeepEqual(met, []bool{true, false, false}) {
		t.Errorf("met %v", met)
	}
	out = run(t, SkillQSOFA, NewInput(ward(), Options{Consciousness: Voice}))
	if *out.Score != 2 || out.Band != "positive" || out.Severity != SeverityHigh {
		t.Errorf("with ACVPU V: score %d band %s, want 2 positive", *out.Score, out.Band)
	}
}

func TestTrendSkill(t *testing.T) {
	// Window ends at the newest observation (4 h) when Now is zero; a 2 h
	// window keeps only the 4 h set.
	out := run(t, SkillVitalsTrend, NewInput(ward(), Options{Window: 2 * time.Hour}))
	if out.Score != nil || out.Severity != SeverityNone || out.Window.End != at(4) || out.Window.Start != at(2) {
		t.Errorf("score %v severity %s window %+v", deref2(out.Score), out.Severity, out.Window)
	}
	for _, c := range out.Components {
		if c.Trend.Count != 1 || c.Text != string(DirectionUnknown) {
			t.Errorf("%s: count %d direction %s, want one point, unknown", c.Name, c.Trend.Count, c.Text)
		}
	}
	// Default 24 h window: both sets. HR 78 → 112 over 4 h rises 34; SBP
	// 128 → 104 falls 24; temperature 36.78 → 38.89 Cel rises 2.11.
	out = run(t, SkillVitalsTrend, NewInput(ward(), Options{}))
	dirs := map[string]string{}
	for _, c := range out.Components {
		dirs[c.Name] = c.Text
	}
	want := map[string]string{
		"respiratory_rate": "rising", "spo2": "falling", "systolic_bp": "falling", "diastolic_bp": "unknown",
		"heart_rate": "rising", "temperature": "rising", "oxygen_flow": "unknown", "gcs": "unknown",
	}
	if !reflect.DeepEqual(dirs, want) {
		t.Errorf("directions %v, want %v", dirs, want)
	}
	if len(out.ObservationIDs) != len(ward()) {
		t.Errorf("%d ids, want all %d", len(out.ObservationIDs), len(ward()))
	}
	if !strings.Contains(strings.Join(out.Recommendations, "\n"), "heart_rate rising: +8.5 /min per hour") {
		t.Errorf("recommendations %q", out.Recommendations)
	}
	// Now before the newest observation moves the window back.
	in := NewInput(ward(), Options{Window: time.Hour})
	in.Now = at(0.5)
	out = run(t, SkillVitalsTrend, in)
	for _, id := range out.ObservationIDs {
		if !strings.HasSuffix(id, "0") {
			t.Errorf("observation %s from after Now used", id)
		}
	}
}

func TestOptionsJSON(t *testing.T) {
	var o Options
	if err := json.Unmarshal([]byte(`{"spo2Scale":2,"onOxygen":true,"consciousness":"confusion","window":"6h","other":1}`), &o); err != nil {
		t.Fatal(err)
	}
	want := Options{SpO2Scale: 2, OnOxygen: new(true), Consciousness: Confusion, Window: 6 * time.Hour}
	if !reflect.DeepEqual(o, want) {
		t.Errorf("decoded %+v, want %+v", o, want)
	}
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	var back Options
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, want) {
		t.Errorf("round trip %s → %+v %v", b, back, err)
	}
	for _, bad := range []string{`{"spo2Scale":3}`, `{"consciousness":"sleepy"}`, `{"window":"soon"}`, `{"window":"-1h"}`, `{"onOxygen":"yes"}`} {
		if err := json.Unmarshal([]byte(bad), &o); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("%s: error %v, want ErrInvalidInput", bad, err)
		}
	}
}

// TestNEWS2OutputGolden pins the JSON an agent session carries. Regenerate
// with: go test ./kernel/clinical -run TestNEWS2OutputGolden -update
func TestNEWS2OutputGolden(t *testing.T) {
	out := run(t, SkillNEWS2, NewInput(ward(), Options{}))
	got, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join("testdata", "news2_output.golden.json")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (rerun with -update if intended):\n%s", path, got)
	}
}
