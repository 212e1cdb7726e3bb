package clinical

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestQSOFACriteriaEdges(t *testing.T) {
	// Each row changes one input on a patient meeting no criterion (RR 16,
	// SBP 120, GCS 15) and expects the score that criterion alone gives.
	for _, tc := range []struct {
		name string
		set  func(*Vitals)
		want int
		met  []string
	}{
		{"none", func(v *Vitals) {}, 0, []string{}},
		{"RR 21", func(v *Vitals) { v.RespiratoryRate = f(21) }, 0, []string{}},
		{"RR 21.9", func(v *Vitals) { v.RespiratoryRate = f(21.9) }, 0, []string{}},
		{"RR 22", func(v *Vitals) { v.RespiratoryRate = f(22) }, 1, []string{CriterionRespiratoryRate}},
		{"RR 22.1", func(v *Vitals) { v.RespiratoryRate = f(22.1) }, 1, []string{CriterionRespiratoryRate}},
		{"SBP 101", func(v *Vitals) { v.SystolicBP = f(101) }, 0, []string{}},
		{"SBP 100.5", func(v *Vitals) { v.SystolicBP = f(100.5) }, 0, []string{}},
		{"SBP 100", func(v *Vitals) { v.SystolicBP = f(100) }, 1, []string{CriterionSystolicBP}},
		{"SBP 99.5", func(v *Vitals) { v.SystolicBP = f(99.5) }, 1, []string{CriterionSystolicBP}},
		{"GCS 15", func(v *Vitals) { v.GCS = f(15) }, 0, []string{}},
		{"GCS 14", func(v *Vitals) { v.GCS = f(14) }, 1, []string{CriterionAlteredMentation}},
		{"GCS 3", func(v *Vitals) { v.GCS = f(3) }, 1, []string{CriterionAlteredMentation}},
		{"ACVPU A", func(v *Vitals) { v.GCS = nil; v.Consciousness = lvl(Alert) }, 0, []string{}},
		{"ACVPU C", func(v *Vitals) { v.GCS = nil; v.Consciousness = lvl(Confusion) }, 1, []string{CriterionAlteredMentation}},
		{"A but GCS 14", func(v *Vitals) { v.Consciousness = lvl(Alert); v.GCS = f(14) }, 1, []string{CriterionAlteredMentation}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Vitals{RespiratoryRate: f(16), SystolicBP: f(120), GCS: f(15)}
			tc.set(&v)
			r, err := QSOFA(v)
			if err != nil {
				t.Fatal(err)
			}
			if r.Score != tc.want || !reflect.DeepEqual(r.CriteriaMet, tc.met) || r.Positive {
				t.Errorf("score %d met %v positive %v, want %d %v false", r.Score, r.CriteriaMet, r.Positive, tc.want, tc.met)
			}
			if len(r.Criteria) != 3 {
				t.Errorf("%d criteria, want all 3", len(r.Criteria))
			}
		})
	}
}

func TestQSOFAScores(t *testing.T) {
	for _, tc := range []struct {
		name     string
		v        Vitals
		score    int
		positive bool
		severity Severity
	}{
		{"0", Vitals{RespiratoryRate: f(18), SystolicBP: f(130), GCS: f(15)}, 0, false, SeverityNone},
		{"1", Vitals{RespiratoryRate: f(24), SystolicBP: f(130), GCS: f(15)}, 1, false, SeverityLow},
		// Hand: RR 24 ≥ 22 yes, SBP 95 ≤ 100 yes, GCS 15 no: 2, positive.
		{"2", Vitals{RespiratoryRate: f(24), SystolicBP: f(95), GCS: f(15)}, 2, true, SeverityHigh},
		// Hand: RR 28 yes, SBP 84 yes, confused yes: 3, positive.
		{"3", Vitals{RespiratoryRate: f(28), SystolicBP: f(84), Consciousness: lvl(Confusion)}, 3, true, SeverityHigh},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := QSOFA(tc.v)
			if err != nil {
				t.Fatal(err)
			}
			if r.Score != tc.score || r.Positive != tc.positive || r.Severity() != tc.severity {
				t.Errorf("score %d positive %v severity %s, want %d %v %s", r.Score, r.Positive, r.Severity(), tc.score, tc.positive, tc.severity)
			}
			wantWord := "negative"
			if tc.positive {
				wantWord = "positive"
			}
			if len(r.Recommendations) == 0 || !strings.Contains(r.Recommendations[0], wantWord) {
				t.Errorf("recommendations %q do not say %s", r.Recommendations, wantWord)
			}
		})
	}
}

func TestQSOFAIgnoresOtherVitals(t *testing.T) {
	// NEWS2-only fields are neither required nor scored.
	r, err := QSOFA(Vitals{RespiratoryRate: f(16), SystolicBP: f(120), GCS: f(15), HeartRate: f(150), SpO2Scale: 7})
	if err != nil || r.Score != 0 {
		t.Errorf("score %d err %v, want 0 nil", r.Score, err)
	}
}

func TestQSOFAInputErrors(t *testing.T) {
	_, err := QSOFA(Vitals{HeartRate: f(80)})
	var ie *InputError
	if !errors.As(err, &ie) || !errors.Is(err, ErrMissingInput) {
		t.Fatalf("error %v, want *InputError with missing inputs", err)
	}
	if want := []string{ParamRespiratoryRate, ParamSystolicBP, ParamConsciousness}; ie.Skill != SkillQSOFA || !reflect.DeepEqual(ie.Missing, want) {
		t.Errorf("skill %s missing %v, want qsofa %v", ie.Skill, ie.Missing, want)
	}
	_, err = QSOFA(Vitals{RespiratoryRate: f(16), SystolicBP: f(-5), GCS: f(2)})
	if !errors.As(err, &ie) || errors.Is(err, ErrMissingInput) || !errors.Is(err, ErrInvalidInput) || len(ie.Invalid) != 2 {
		t.Errorf("error %v, want two invalid inputs and none missing", err)
	}
}

func TestQSOFADoesNotAliasInput(t *testing.T) {
	v := Vitals{RespiratoryRate: f(24), SystolicBP: f(95), GCS: f(14)}
	r, err := QSOFA(v)
	if err != nil {
		t.Fatal(err)
	}
	*v.RespiratoryRate, *v.SystolicBP, *v.GCS = 1, 2, 3
	if *r.Criteria[0].Value != 24 || *r.Criteria[1].Value != 95 || *r.Criteria[2].Value != 14 {
		t.Errorf("result changed with its input: %v %v %v", *r.Criteria[0].Value, *r.Criteria[1].Value, *r.Criteria[2].Value)
	}
}

func TestNEWS2Severity(t *testing.T) {
	for _, tc := range []struct {
		band  Band
		total int
		want  Severity
	}{
		{BandLow, 0, SeverityNone},
		{BandLow, 1, SeverityLow},
		{BandLow, 4, SeverityLow},
		{BandLowMedium, 3, SeverityMedium},
		{BandLowMedium, 4, SeverityMedium},
		{BandMedium, 5, SeverityHigh},
		{BandMedium, 6, SeverityHigh},
		{BandHigh, 7, SeverityCritical},
		{BandHigh, 20, SeverityCritical},
		{"bogus", 0, SeverityNone},
		{"bogus", 2, SeverityLow},
		{"bogus", 5, SeverityHigh},
		{"bogus", 9, SeverityCritical},
	} {
		if got := NEWS2Severity(tc.band, tc.total); got != tc.want {
			t.Errorf("NEWS2Severity(%q, %d) = %s, want %s", tc.band, tc.total, got, tc.want)
		}
	}
}

func TestSeverity(t *testing.T) {
	order := []Severity{SeverityNone, SeverityLow, SeverityMedium, SeverityHigh, SeverityCritical}
	for i, s := range order {
		if s.Rank() != i {
			t.Errorf("%s rank %d, want %d", s, s.Rank(), i)
		}
	}
	if Severity("URGENT").Rank() != -1 {
		t.Error("unknown severity ranks")
	}
	for _, tc := range []struct {
		in   []Severity
		want Severity
	}{
		{nil, SeverityNone},
		{[]Severity{SeverityLow}, SeverityLow},
		{[]Severity{SeverityHigh, SeverityLow, SeverityMedium}, SeverityHigh},
		{[]Severity{SeverityLow, SeverityCritical}, SeverityCritical},
		{[]Severity{"bogus", SeverityNone}, SeverityNone},
	} {
		if got := MaxSeverity(tc.in...); got != tc.want {
			t.Errorf("MaxSeverity(%v) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
