package demo

import (
	"math"
	"math/rand/v2"
)

// vitalCode is one LOINC vital sign the demo records for every patient at every reading.
type vitalCode struct {
	loinc   string
	display string
	unit    string // UCUM, used as both valueQuantity.unit and valueQuantity.code
}

// The eight vital signs NEWS2 and qSOFA need, in the order a reading stores them.
var vitalCodes = [...]vitalCode{
	{"9279-1", "Respiratory rate", "/min"},
	{"59408-5", "Oxygen saturation in Arterial blood by Pulse oximetry", "%"},
	{"8480-6", "Systolic blood pressure", "mm[Hg]"},
	{"8462-4", "Diastolic blood pressure", "mm[Hg]"},
	{"8867-4", "Heart rate", "/min"},
	{"8310-5", "Body temperature", "Cel"},
	{"3151-8", "Inhaled oxygen flow rate", "L/min"},
	{"9269-2", "Glasgow coma score total", "{score}"},
}

// vitals is one set of readings taken together. Field order follows vitalCodes.
type vitals struct {
	RR, SpO2, SBP, DBP, HR, Temp, O2Flow, GCS float64
}

func (v vitals) values() [len(vitalCodes)]float64 {
	return [...]float64{v.RR, v.SpO2, v.SBP, v.DBP, v.HR, v.Temp, v.O2Flow, v.GCS}
}

// news2 scores v by the Royal College of Physicians NEWS2 chart (SpO2 scale 1; a GCS below 15
// counts as new confusion). It returns the total and the highest single-parameter score; the
// generator uses them to keep each patient's latest vitals consistent with its risk_level.
func news2(v vitals) (total, maxSingle int) {
	parts := [...]int{
		band(v.RR, []float64{8, 11, 20, 24}, []int{3, 1, 0, 2, 3}),
		spo2Score(v.SpO2),
		o2Score(v.O2Flow),
		sbpScore(v.SBP),
		band(v.HR, []float64{40, 50, 90, 110, 130}, []int{3, 1, 0, 1, 2, 3}),
		gcsScore(v.GCS),
		tempScore(v.Temp),
	}
	for _, p := range parts {
		total += p
		maxSingle = max(maxSingle, p)
	}
	return total, maxSingle
}

// band returns scores[i] for the first upper bound v does not exceed, else the last score.
func band(v float64, upper []float64, scores []int) int {
	for i, u := range upper {
		if v <= u {
			return scores[i]
		}
	}
	return scores[len(scores)-1]
}

func spo2Score(v float64) int { return band(v, []float64{91, 93, 95}, []int{3, 2, 1, 0}) }

func o2Score(flow float64) int {
	if flow > 0 {
		return 2
	}
	return 0
}

func sbpScore(v float64) int { return band(v, []float64{90, 100, 110, 219}, []int{3, 2, 1, 0, 3}) }

func gcsScore(v float64) int {
	if v < 15 {
		return 3
	}
	return 0
}

func tempScore(v float64) int {
	return band(v, []float64{35.0, 36.0, 38.0, 39.0}, []int{3, 1, 0, 1, 2})
}

// Risk levels stored on patients (lowercase, as the spec's riskLevel shows).
const (
	riskLow      = "low"
	riskModerate = "moderate"
	riskHigh     = "high"
	riskCritical = "critical"
)

// riskLevel maps a NEWS2 result to a risk level: the NEWS2 clinical-risk bands, with the
// "low-medium" band (a single parameter scoring 3) counted as moderate.
func riskLevel(total, maxSingle int) string {
	switch {
	case total >= 7:
		return riskCritical
	case total >= 5:
		return riskHigh
	case total >= 3 || maxSingle == 3:
		return riskModerate
	default:
		return riskLow
	}
}

// vitalsRange bounds the latest vitals sampled for a risk level.
type vitalsRange struct {
	rr, spo2, sbp, hr [2]int
	temp              [2]float64
	o2                []float64
	gcs               []float64
}

var targetRanges = map[string]vitalsRange{
	riskLow: {
		rr: [2]int{12, 20}, spo2: [2]int{94, 99}, sbp: [2]int{106, 148}, hr: [2]int{56, 94},
		temp: [2]float64{36.2, 37.6}, o2: []float64{0}, gcs: []float64{15},
	},
	riskModerate: {
		rr: [2]int{16, 23}, spo2: [2]int{92, 97}, sbp: [2]int{96, 135}, hr: [2]int{72, 108},
		temp: [2]float64{36.3, 38.5}, o2: []float64{0, 0, 0, 0, 0, 0, 1, 2}, gcs: []float64{15},
	},
	riskHigh: {
		rr: [2]int{19, 26}, spo2: [2]int{91, 96}, sbp: [2]int{92, 124}, hr: [2]int{86, 124},
		temp: [2]float64{36.8, 38.9}, o2: []float64{0, 0, 2}, gcs: []float64{15},
	},
	riskCritical: {
		rr: [2]int{22, 32}, spo2: [2]int{86, 94}, sbp: [2]int{78, 104}, hr: [2]int{104, 140},
		temp: [2]float64{37.8, 39.8}, o2: []float64{0, 2, 4, 6},
		gcs: []float64{15, 15, 15, 15, 15, 15, 14, 13},
	},
}

// sampleVitals draws latest vitals whose NEWS2 falls in risk's band, by rejection: the ranges
// overlap the neighbouring bands, so every draw is a plausible set and the band is exact.
func sampleVitals(r *rand.Rand, risk string) vitals {
	g := targetRanges[risk]
	for {
		v := vitals{
			RR:     float64(between(r, g.rr[0], g.rr[1])),
			SpO2:   float64(between(r, g.spo2[0], g.spo2[1])),
			SBP:    float64(between(r, g.sbp[0], g.sbp[1])),
			HR:     float64(between(r, g.hr[0], g.hr[1])),
			Temp:   round1(g.temp[0] + r.Float64()*(g.temp[1]-g.temp[0])),
			O2Flow: pick(r, g.o2),
			GCS:    pick(r, g.gcs),
		}
		v.DBP = math.Round(v.SBP * (0.54 + r.Float64()*0.12))
		if riskLevel(news2(v)) == risk {
			return v
		}
	}
}

// readingsPerPatient readings, one every readingInterval hours, end at each patient's latest.
const (
	readingsPerPatient = 18
	readingIntervalH   = 4
)

// trajectory is how a patient's vitals move over the observation window: from start to latest,
// beginning at onset (a fraction of the window) and bending by curve (>1 accelerates late).
type trajectory struct {
	start, latest vitals
	onset, curve  float64
}

// readings returns readingsPerPatient vitals sets, oldest first. The last is exactly latest, so
// the stored risk_level matches what a NEWS2 agent computes from the newest observations; the
// others carry measurement noise.
func (tr trajectory) readings(r *rand.Rand) []vitals {
	out := make([]vitals, readingsPerPatient)
	last := readingsPerPatient - 1
	for k := range out {
		if k == last {
			out[k] = tr.latest
			continue
		}
		x := float64(k) / float64(last)
		p := 0.0
		if x > tr.onset {
			p = math.Pow((x-tr.onset)/(1-tr.onset), tr.curve)
		}
		lerp := func(a, b float64) float64 { return a + (b-a)*p }
		noise := func(amp float64) float64 { return (r.Float64()*2 - 1) * amp }
		v := vitals{
			RR:   clamp(math.Round(lerp(tr.start.RR, tr.latest.RR)+noise(1.2)), 8, 40),
			SpO2: clamp(math.Round(lerp(tr.start.SpO2, tr.latest.SpO2)+noise(1.2)), 80, 100),
			SBP:  clamp(math.Round(lerp(tr.start.SBP, tr.latest.SBP)+noise(6)), 70, 220),
			DBP:  clamp(math.Round(lerp(tr.start.DBP, tr.latest.DBP)+noise(4)), 40, 130),
			HR:   clamp(math.Round(lerp(tr.start.HR, tr.latest.HR)+noise(4)), 40, 180),
			Temp: clamp(round1(lerp(tr.start.Temp, tr.latest.Temp)+noise(0.15)), 34.5, 41),
			GCS:  15,
		}
		if tr.latest.O2Flow > 0 && p >= 0.55 {
			v.O2Flow = tr.latest.O2Flow
		}
		if tr.latest.GCS < 15 && p >= 0.85 {
			v.GCS = tr.latest.GCS
		}
		out[k] = v
	}
	return out
}

// newTrajectory draws a trajectory ending in risk's band. Low-risk patients drift within normal
// ranges; the others start normal and deteriorate from a random onset.
func newTrajectory(r *rand.Rand, risk string) trajectory {
	latest := sampleVitals(r, risk)
	if risk == riskLow {
		start := latest
		start.RR += float64(between(r, -2, 2))
		start.HR += float64(between(r, -6, 6))
		start.SBP += float64(between(r, -8, 8))
		start.DBP += float64(between(r, -5, 5))
		start.SpO2 = min(100, start.SpO2+float64(between(r, -1, 1)))
		start.Temp = round1(start.Temp + float64(between(r, -3, 3))/10)
		return trajectory{start: start, latest: latest, onset: 0, curve: 1}
	}
	tr := trajectory{
		start:  sampleVitals(r, riskLow),
		latest: latest,
		onset:  0.2 + r.Float64()*0.45,
		curve:  1.2 + r.Float64()*0.6,
	}
	if risk == riskCritical {
		tr.curve += 0.6 // critical patients crash late
	}
	return tr
}

func round1(v float64) float64 { return math.Round(v*10) / 10 }

func clamp(v, lo, hi float64) float64 { return min(max(v, lo), hi) }
