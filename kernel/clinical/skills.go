package clinical

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// reader pulls normalized latest values out of an Input for one skill run,
// recording unusable observations and the ids of the ones used.
type reader struct {
	in  Input
	c   *inputErrors
	ids []string
}

// latest returns the latest value of code in its canonical unit, or nil when
// there is none or it is unusable (then recorded as invalid under param).
func (r *reader) latest(code, param string) (*float64, Observation) {
	o, ok := r.in.Latest[code]
	if !ok {
		return nil, Observation{}
	}
	vs, _ := VitalByCode(code)
	x, reason := vs.normalize(o.Value, o.Unit)
	if reason != "" {
		r.c.bad(param, "observation %s: %s", o.ID, reason)
		return nil, Observation{}
	}
	return &x, o
}

func (r *reader) use(o Observation) {
	if o.ID != "" && !slices.Contains(r.ids, o.ID) {
		r.ids = append(r.ids, o.ID)
	}
}

// merge folds a score's own *InputError into the reader's: a parameter the
// reader already called invalid is not also missing.
func (r *reader) merge(err error) error {
	if ie, ok := err.(*InputError); ok {
		for _, m := range ie.Missing {
			if !slices.ContainsFunc(r.c.invalid, func(iv InvalidValue) bool { return iv.Parameter == m }) {
				r.c.miss(m)
			}
		}
		r.c.invalid = append(r.c.invalid, ie.Invalid...)
	} else if err != nil {
		return err
	}
	return r.c.err()
}

func component(name string, o Observation, x *float64, score int) Component {
	k := Component{Name: name, Code: o.Code, Value: copyPtr(x), Unit: o.Unit, Score: &score, ObservationID: o.ID}
	if vs, ok := VitalByCode(o.Code); ok {
		k.Unit = vs.Unit // the value is normalized
	}
	return k
}

// news2Skill runs NEWS2 over the latest observations.
type news2Skill struct{}

func (news2Skill) Name() string { return SkillNEWS2 }

func (news2Skill) Codes() []string {
	return []string{LOINCRespiratoryRate, LOINCOxygenSaturation, LOINCInhaledOxygenFlow, LOINCSystolicBP,
		LOINCHeartRate, LOINCGlasgowComaScore, LOINCBodyTemperature}
}

// Run reads the latest observation per code. Supplemental oxygen comes from
// Options.OnOxygen or else the latest inhaled oxygen flow (> 0 L/min is
// oxygen); consciousness from Options.Consciousness and/or the latest GCS
// (the worse wins).
func (news2Skill) Run(in Input) (Output, error) {
	c := inputErrors{skill: SkillNEWS2}
	r := reader{in: in, c: &c}
	v := Vitals{SpO2Scale: in.Options.SpO2Scale, OnOxygen: in.Options.OnOxygen}
	rr, rrObs := r.latest(LOINCRespiratoryRate, ParamRespiratoryRate)
	spo2, spo2Obs := r.latest(LOINCOxygenSaturation, ParamSpO2)
	var flow *float64
	var flowObs Observation
	if v.OnOxygen == nil {
		flow, flowObs = r.latest(LOINCInhaledOxygenFlow, ParamSupplementalOxygen)
		if flow != nil {
			on := *flow > 0
			v.OnOxygen = &on
		}
	}
	sbp, sbpObs := r.latest(LOINCSystolicBP, ParamSystolicBP)
	hr, hrObs := r.latest(LOINCHeartRate, ParamHeartRate)
	gcs, gcsObs := r.latest(LOINCGlasgowComaScore, ParamConsciousness)
	if in.Options.Consciousness != "" {
		level := in.Options.Consciousness
		v.Consciousness = &level
	}
	temp, tempObs := r.latest(LOINCBodyTemperature, ParamTemperature)
	v.RespiratoryRate, v.SpO2, v.SystolicBP, v.HeartRate, v.GCS, v.Temperature = rr, spo2, sbp, hr, gcs, temp

	res, err := NEWS2(v)
	if err := r.merge(err); err != nil {
		return Output{}, err
	}

	s := res.Subscores
	spo2Comp := component(ParamSpO2, spo2Obs, spo2, s.SpO2)
	spo2Comp.Text = fmt.Sprintf("scale %d", res.SpO2Scale)
	oxy := component(ParamSupplementalOxygen, flowObs, flow, s.SupplementalOxygen)
	oxy.Text = "air"
	if *v.OnOxygen {
		oxy.Text = "oxygen"
	}
	if in.Options.OnOxygen != nil {
		oxy.Text += " (option)"
	}
	cons := component(ParamConsciousness, gcsObs, gcs, s.Consciousness)
	cons.Text = "alert"
	if s.Consciousness > 0 {
		cons.Text = "not alert"
	}
	if v.Consciousness != nil {
		cons.Text += " (ACVPU " + string(*v.Consciousness) + ")"
	}
	comps := []Component{
		component(ParamRespiratoryRate, rrObs, rr, s.RespiratoryRate),
		spo2Comp,
		oxy,
		component(ParamSystolicBP, sbpObs, sbp, s.SystolicBP),
		component(ParamHeartRate, hrObs, hr, s.HeartRate),
		cons,
		component(ParamTemperature, tempObs, temp, s.Temperature),
	}
	for _, o := range []Observation{rrObs, spo2Obs, flowObs, sbpObs, hrObs, gcsObs, tempObs} {
		r.use(o)
	}
	total, red := res.Total, res.RedScore
	return Output{
		Skill: SkillNEWS2, Score: &total, Band: string(res.Band), Severity: res.Severity(),
		RedScore: &red, Response: res.Response, Monitoring: res.Monitoring, SpO2Scale: res.SpO2Scale,
		Components: comps, Recommendations: res.Recommendations, ObservationIDs: nonNil(r.ids),
	}, nil
}

// qsofaSkill runs qSOFA over the latest observations.
type qsofaSkill struct{}

func (qsofaSkill) Name() string { return SkillQSOFA }

func (qsofaSkill) Codes() []string {
	return []string{LOINCRespiratoryRate, LOINCSystolicBP, LOINCGlasgowComaScore}
}

// Run reads the latest respiratory rate, systolic BP and GCS; altered
// mentation may also come from Options.Consciousness.
func (qsofaSkill) Run(in Input) (Output, error) {
	c := inputErrors{skill: SkillQSOFA}
	r := reader{in: in, c: &c}
	var v Vitals
	rr, rrObs := r.latest(LOINCRespiratoryRate, ParamRespiratoryRate)
	sbp, sbpObs := r.latest(LOINCSystolicBP, ParamSystolicBP)
	gcs, gcsObs := r.latest(LOINCGlasgowComaScore, ParamConsciousness)
	if in.Options.Consciousness != "" {
		level := in.Options.Consciousness
		v.Consciousness = &level
	}
	v.RespiratoryRate, v.SystolicBP, v.GCS = rr, sbp, gcs

	res, err := QSOFA(v)
	if err := r.merge(err); err != nil {
		return Output{}, err
	}
	obs := []Observation{rrObs, sbpObs, gcsObs}
	comps := make([]Component, len(res.Criteria))
	for i, k := range res.Criteria {
		pts := 0
		if k.Met {
			pts = 1
		}
		comps[i] = component(k.Name, obs[i], k.Value, pts)
		met := k.Met
		comps[i].Met = &met
		comps[i].Text = k.Threshold
		if k.Level != "" {
			comps[i].Text += "; ACVPU " + string(k.Level)
		}
		r.use(obs[i])
	}
	band := "negative"
	if res.Positive {
		band = "positive"
	}
	score, pos := res.Score, res.Positive
	return Output{
		Skill: SkillQSOFA, Score: &score, Band: band, Severity: res.Severity(), Positive: &pos,
		Components: comps, Recommendations: res.Recommendations, ObservationIDs: nonNil(r.ids),
	}, nil
}

// trendSkill summarizes every vital sign over a window.
type trendSkill struct{}

func (trendSkill) Name() string { return SkillVitalsTrend }

func (trendSkill) Codes() []string {
	out := make([]string, len(vitalSigns))
	for i, vs := range vitalSigns {
		out[i] = vs.Code
	}
	return out
}

// paramVitalSigns names "at least one vital sign in the window" in an
// InputError.
const paramVitalSigns = "vital_signs"

// Run summarizes Input.Series over the Options.Window (default 24 h) ending
// at Input.Now, or at the newest observation when Now is zero.
func (trendSkill) Run(in Input) (Output, error) {
	c := inputErrors{skill: SkillVitalsTrend}
	window := in.Options.Window
	if window <= 0 {
		window = DefaultTrendWindow
	}
	end := in.Now
	if end.IsZero() {
		for _, vs := range vitalSigns {
			for _, o := range in.Series[vs.Code] {
				if o.EffectiveAt.After(end) {
					end = o.EffectiveAt
				}
			}
		}
	}
	if end.IsZero() {
		c.miss(paramVitalSigns)
		return Output{}, c.err()
	}
	w := Window{Start: end.Add(-window), End: end}

	series := map[string][]Point{}
	var ids []string
	for _, vs := range vitalSigns {
		obs := slices.Clone(in.Series[vs.Code])
		slices.SortStableFunc(obs, func(a, b Observation) int {
			if n := a.EffectiveAt.Compare(b.EffectiveAt); n != 0 {
				return n
			}
			return strings.Compare(a.ID, b.ID)
		})
		for _, o := range obs {
			if !w.Contains(o.EffectiveAt) {
				continue
			}
			x, reason := vs.normalize(o.Value, o.Unit)
			if reason != "" {
				c.bad(vs.Name, "observation %s: %s", o.ID, reason)
				continue
			}
			series[vs.Code] = append(series[vs.Code], Point{Time: o.EffectiveAt, Value: x})
			if o.ID != "" {
				ids = append(ids, o.ID)
			}
		}
	}
	if err := c.err(); err != nil {
		return Output{}, err
	}
	trends, err := Trend(series, w)
	if err != nil {
		return Output{}, err
	}
	if len(trends) == 0 {
		c.miss(paramVitalSigns)
		return Output{}, c.err()
	}

	comps := make([]Component, len(trends))
	var recs, unknown []string
	for i := range trends {
		t := trends[i]
		last := t.Last
		comps[i] = Component{Name: t.Name, Code: t.Code, Value: &last, Unit: t.Unit, Text: string(t.Direction), Trend: &t}
		switch t.Direction {
		case DirectionRising, DirectionFalling:
			recs = append(recs, fmt.Sprintf("%s %s: %s %s per hour, fitted change %s %s over %s (tolerance %s %s).",
				t.Name, t.Direction, signed(*t.RatePerHour), t.Unit, signed(t.Change), t.Unit,
				t.LastAt.Sub(t.FirstAt).Round(time.Minute), num(t.Tolerance), t.Unit))
		case DirectionUnknown:
			unknown = append(unknown, t.Name)
		}
	}
	if len(recs) == 0 {
		recs = append(recs, "No vital sign changed beyond its tolerance in the window.")
	} else {
		recs = append(recs, "Review changing vital signs against the patient's NEWS2 and baseline.")
	}
	if len(unknown) > 0 {
		recs = append(recs, "Too few observations in the window to show a trend: "+strings.Join(unknown, ", ")+".")
	}
	return Output{
		Skill: SkillVitalsTrend, Severity: SeverityNone, Window: &w,
		Components: comps, Recommendations: recs, ObservationIDs: nonNil(ids),
	}, nil
}

func num(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }

func signed(x float64) string {
	if x > 0 {
		return "+" + num(x)
	}
	return num(x)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
