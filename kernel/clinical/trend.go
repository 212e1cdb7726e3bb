package clinical

import (
	"math"
	"sort"
	"time"
)

// Point is one measurement of a vital sign, in its canonical unit.
type Point struct {
	Time  time.Time `json:"time"`
	Value float64   `json:"value"`
}

// Window bounds a trend, both ends inclusive. A zero Start or End leaves
// that side open.
type Window struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
}

// Contains reports whether t lies in w.
func (w Window) Contains(t time.Time) bool {
	return (w.Start.IsZero() || !t.Before(w.Start)) && (w.End.IsZero() || !t.After(w.End))
}

// Direction is where a vital sign is heading over a window.
type Direction string

// Directions. Unknown means the data cannot show a direction: fewer than
// two points, or all points at the same instant.
const (
	DirectionRising  Direction = "rising"
	DirectionFalling Direction = "falling"
	DirectionStable  Direction = "stable"
	DirectionUnknown Direction = "unknown"
)

// VitalTrend summarizes one vital sign over a window.
type VitalTrend struct {
	Code    string    `json:"code"`
	Name    string    `json:"name"`
	Unit    string    `json:"unit"`
	Count   int       `json:"count"`
	First   float64   `json:"first"` // earliest value in the window
	Last    float64   `json:"last"`  // latest value in the window
	Min     float64   `json:"min"`
	Max     float64   `json:"max"`
	FirstAt time.Time `json:"firstAt"`
	LastAt  time.Time `json:"lastAt"`
	// RatePerHour is the least-squares slope of value against time, in Unit
	// per hour; nil when Direction is unknown.
	RatePerHour *float64 `json:"ratePerHour"`
	// Change is RatePerHour times the hours from FirstAt to LastAt: the
	// change the fitted line shows across the data, which Direction compares
	// with Tolerance. Using the fit rather than Last − First keeps one noisy
	// reading at either end from deciding the direction.
	Change    float64   `json:"change"`
	Tolerance float64   `json:"tolerance"`
	Direction Direction `json:"direction"`
}

// Trend summarizes each vital sign of series (keyed by LOINC code) over w.
//
// Direction rule: |Change| ≥ the vital's TrendTolerance (VitalSigns) is
// rising or falling by its sign, anything smaller is stable; the comparison
// allows 1e-9 for floating-point error so that an exact tolerance counts.
// RatePerHour and Change are rounded to 0.001 after the direction is
// decided.
//
// Points outside w are ignored, as are codes outside VitalSigns; a vital
// with no point in w is left out. The result follows the order of
// VitalSigns. Values must be in the canonical unit and plausible, else the
// error is an *InputError naming the vital.
func Trend(series map[string][]Point, w Window) ([]VitalTrend, error) {
	c := inputErrors{skill: SkillVitalsTrend}
	var out []VitalTrend
	for _, vs := range vitalSigns {
		var pts []Point
		for _, p := range series[vs.Code] {
			if !w.Contains(p.Time) {
				continue
			}
			if !vs.Plausible(p.Value) {
				c.bad(vs.Name, "%v %s at %s outside plausible range %v–%v", p.Value, vs.Unit, p.Time.UTC().Format(time.RFC3339), vs.Min, vs.Max)
				continue
			}
			pts = append(pts, p)
		}
		if len(pts) == 0 {
			continue
		}
		out = append(out, summarize(vs, pts))
	}
	if err := c.err(); err != nil {
		return nil, err
	}
	return out, nil
}

// summarize requires len(pts) > 0; it sorts pts.
func summarize(vs Vital, pts []Point) VitalTrend {
	sort.SliceStable(pts, func(i, j int) bool { return pts[i].Time.Before(pts[j].Time) })
	first, last := pts[0], pts[len(pts)-1]
	t := VitalTrend{
		Code: vs.Code, Name: vs.Name, Unit: vs.Unit, Count: len(pts),
		First: first.Value, Last: last.Value, Min: first.Value, Max: first.Value,
		FirstAt: first.Time, LastAt: last.Time,
		Tolerance: vs.TrendTolerance, Direction: DirectionUnknown,
	}
	var meanT, meanY float64
	for _, p := range pts {
		t.Min = math.Min(t.Min, p.Value)
		t.Max = math.Max(t.Max, p.Value)
		meanT += hoursSince(first.Time, p.Time)
		meanY += p.Value
	}
	n := float64(len(pts))
	meanT /= n
	meanY /= n
	var sxy, sxx float64
	for _, p := range pts {
		dt := hoursSince(first.Time, p.Time) - meanT
		sxy += dt * (p.Value - meanY)
		sxx += dt * dt
	}
	if sxx == 0 {
		return t // one point, or all at one instant: no slope
	}
	slope := sxy / sxx
	change := slope * hoursSince(first.Time, last.Time)
	switch {
	case change >= vs.TrendTolerance-1e-9:
		t.Direction = DirectionRising
	case change <= -vs.TrendTolerance+1e-9:
		t.Direction = DirectionFalling
	default:
		t.Direction = DirectionStable
	}
	rate := round3(slope)
	t.RatePerHour = &rate
	t.Change = round3(change)
	return t
}

func hoursSince(from, t time.Time) float64 { return t.Sub(from).Hours() }

func round3(x float64) float64 {
	r := math.Round(x*1000) / 1000
	if r == 0 {
		return 0 // no "-0" in JSON
	}
	return r
}
