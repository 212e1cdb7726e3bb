package clinical

import "fmt"

// qSOFA criterion names, as used in QSOFAResult.CriteriaMet.
const (
	CriterionRespiratoryRate  = "respiratory_rate_ge_22"
	CriterionSystolicBP       = "systolic_bp_le_100"
	CriterionAlteredMentation = "altered_mentation"
)

// QSOFACriterion is one qSOFA criterion as evaluated.
type QSOFACriterion struct {
	Name string `json:"name"`
	Met  bool   `json:"met"`
	// Value is the measured value; for mentation the GCS, absent when only
	// an ACVPU level was given.
	Value *float64 `json:"value,omitempty"`
	// Level is the ACVPU level, for mentation when one was given.
	Level     Consciousness `json:"level,omitempty"`
	Threshold string        `json:"threshold"` // e.g. "≥ 22 /min"
}

// QSOFAResult is a computed qSOFA.
type QSOFAResult struct {
	Score           int              `json:"score"`    // 0–3
	Positive        bool             `json:"positive"` // score ≥ 2
	Criteria        []QSOFACriterion `json:"criteria"` // always all three, in the paper's order
	CriteriaMet     []string         `json:"criteriaMet"`
	Recommendations []string         `json:"recommendations"`
}

// Severity maps qSOFA onto carehub's workflow severity: 0 → NONE, 1 → LOW,
// 2 or 3 (positive) → HIGH. Sepsis-3 defines one threshold, so carehub does
// not invent a CRITICAL level for 3; a positive qSOFA is an urgent-review
// signal like NEWS2's medium band.
func (r QSOFAResult) Severity() Severity {
	switch {
	case r.Positive:
		return SeverityHigh
	case r.Score == 1:
		return SeverityLow
	}
	return SeverityNone
}

// QSOFA computes the quick Sequential Organ Failure Assessment (Sepsis-3,
// Singer et al., JAMA 2016): one point each for respiratory rate ≥ 22/min,
// systolic blood pressure ≤ 100 mmHg and altered mentation (GCS < 15, or any
// ACVPU level other than Alert); positive at 2 or more.
//
// The criteria are continuous inequalities, not chart rows, so they apply
// exactly: 21.9/min does not meet "≥ 22" and 100.5 mmHg does not meet
// "≤ 100". RespiratoryRate, SystolicBP and one of Consciousness or GCS are
// required; other fields of v are ignored. A missing or invalid input gives
// an *InputError listing all of them.
func QSOFA(v Vitals) (QSOFAResult, error) {
	c := inputErrors{skill: SkillQSOFA}
	if v.RespiratoryRate == nil {
		c.miss(ParamRespiratoryRate)
	}
	if v.SystolicBP == nil {
		c.miss(ParamSystolicBP)
	}
	if v.Consciousness == nil && v.GCS == nil {
		c.miss(ParamConsciousness)
	}
	checkValue(&c, ParamRespiratoryRate, LOINCRespiratoryRate, v.RespiratoryRate)
	checkValue(&c, ParamSystolicBP, LOINCSystolicBP, v.SystolicBP)
	checkConsciousness(&c, v)
	if err := c.err(); err != nil {
		return QSOFAResult{}, err
	}

	alert, _ := v.alert()
	mentation := QSOFACriterion{Name: CriterionAlteredMentation, Met: !alert, Value: copyPtr(v.GCS), Threshold: "GCS < 15 or not Alert"}
	if v.Consciousness != nil {
		mentation.Level = *v.Consciousness
	}
	r := QSOFAResult{Criteria: []QSOFACriterion{
		{Name: CriterionRespiratoryRate, Met: *v.RespiratoryRate >= 22, Value: copyPtr(v.RespiratoryRate), Threshold: "≥ 22 /min"},
		{Name: CriterionSystolicBP, Met: *v.SystolicBP <= 100, Value: copyPtr(v.SystolicBP), Threshold: "≤ 100 mm[Hg]"},
		mentation,
	}}
	r.CriteriaMet = []string{}
	for _, k := range r.Criteria {
		if k.Met {
			r.Score++
			r.CriteriaMet = append(r.CriteriaMet, k.Name)
		}
	}
	r.Positive = r.Score >= 2
	if r.Positive {
		r.Recommendations = []string{
			fmt.Sprintf("qSOFA %d of 3 (positive): if infection is known or suspected, the patient is at high risk of a poor outcome.", r.Score),
			"Assess for organ dysfunction (full SOFA score, lactate), consider sepsis and escalate to the medical team.",
		}
	} else {
		r.Recommendations = []string{
			fmt.Sprintf("qSOFA %d of 3 (negative): a negative qSOFA does not exclude sepsis.", r.Score),
			"Continue monitoring and reassess if the patient deteriorates.",
		}
	}
	return r, nil
}

// copyPtr keeps results from aliasing the caller's inputs.
func copyPtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
