package clinical

import (
	"encoding/json"
	"fmt"
	"sort"
	"time"
)

// Names of the built-in skills.
const (
	SkillNEWS2       = "news2"
	SkillQSOFA       = "qsofa"
	SkillVitalsTrend = "vitals_trend"
)

// Skill is a built-in clinical skill an agent runs over a patient's stored
// observations. Implementations are stateless and safe for concurrent use;
// Run is a pure function of its Input.
type Skill interface {
	// Name is the registry name, e.g. "news2".
	Name() string
	// Codes lists the LOINC codes the skill reads, so a caller can load only
	// those observations.
	Codes() []string
	// Run computes the skill's output. Missing or invalid inputs give an
	// *InputError (errors.Is ErrMissingInput / ErrInvalidInput) and no
	// output; a skill never fills a gap with an assumed value.
	Run(in Input) (Output, error)
}

// Observation is one stored vital-sign observation as a skill sees it.
type Observation struct {
	ID          string    `json:"id"`   // obs_…
	Code        string    `json:"code"` // LOINC
	Value       float64   `json:"value"`
	Unit        string    `json:"unit"` // UCUM; converted with Normalize
	EffectiveAt time.Time `json:"effectiveAt"`
}

// Options are caller choices that the observations cannot carry. They decode
// from an agent run's input JSON, e.g.
//
//	{"spo2Scale": 2, "onOxygen": true, "consciousness": "confusion", "window": "6h"}
//
// Unknown fields are ignored, so the same JSON may carry other inputs.
type Options struct {
	// SpO2Scale selects the NEWS2 SpO2 scale, 1 or 2; 0 means 1.
	SpO2Scale int
	// OnOxygen, when set, overrides the inhaled oxygen flow observation.
	OnOxygen *bool
	// Consciousness, when set, is an ACVPU assessment used alongside (and,
	// if worse, over) the latest GCS.
	Consciousness Consciousness
	// Window is the vitals trend window, ending at Input.Now; 0 means
	// DefaultTrendWindow.
	Window time.Duration
}

// DefaultTrendWindow is the vitals trend window when Options.Window is 0.
const DefaultTrendWindow = 24 * time.Hour

type optionsJSON struct {
	SpO2Scale     int    `json:"spo2Scale,omitempty"`
	OnOxygen      *bool  `json:"onOxygen,omitempty"`
	Consciousness string `json:"consciousness,omitempty"`
	Window        string `json:"window,omitempty"` // Go duration, e.g. "6h", "90m"
}

// MarshalJSON writes the form UnmarshalJSON reads.
func (o Options) MarshalJSON() ([]byte, error) {
	j := optionsJSON{SpO2Scale: o.SpO2Scale, OnOxygen: o.OnOxygen, Consciousness: string(o.Consciousness)}
	if o.Window != 0 {
		j.Window = o.Window.String()
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads options; a bad value is an error wrapping
// ErrInvalidInput.
func (o *Options) UnmarshalJSON(b []byte) error {
	var j optionsJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return fmt.Errorf("decode skill options: %v: %w", err, ErrInvalidInput)
	}
	out := Options{SpO2Scale: j.SpO2Scale, OnOxygen: j.OnOxygen}
	if out.SpO2Scale != 0 && out.SpO2Scale != SpO2Scale1 && out.SpO2Scale != SpO2Scale2 {
		return fmt.Errorf("skill options: spo2Scale %d is not 1 or 2: %w", j.SpO2Scale, ErrInvalidInput)
	}
	if j.Consciousness != "" {
		c, ok := ParseConsciousness(j.Consciousness)
		if !ok {
			return fmt.Errorf("skill options: consciousness %q is not one of A, C, V, P, U: %w", j.Consciousness, ErrInvalidInput)
		}
		out.Consciousness = c
	}
	if j.Window != "" {
		d, err := time.ParseDuration(j.Window)
		if err != nil || d <= 0 {
			return fmt.Errorf("skill options: window %q is not a positive duration such as \"6h\": %w", j.Window, ErrInvalidInput)
		}
		out.Window = d
	}
	*o = out
	return nil
}

// Input is what a skill runs over.
type Input struct {
	// Latest holds the newest observation per LOINC code (NEWS2, qSOFA).
	Latest map[string]Observation
	// Series holds every observation per LOINC code (vitals trend), any order.
	Series map[string][]Observation
	// Options are the caller's choices.
	Options Options
	// Now ends the trend window. Skills never read the clock: zero means the
	// time of the newest observation in Series.
	Now time.Time
}

// NewInput builds an Input from a patient's observations: Latest takes the
// newest per code (ties broken by the larger ID, so the choice is
// deterministic), Series takes them all. Now is left zero.
func NewInput(obs []Observation, opts Options) Input {
	in := Input{Latest: map[string]Observation{}, Series: map[string][]Observation{}, Options: opts}
	for _, o := range obs {
		in.Series[o.Code] = append(in.Series[o.Code], o)
		cur, ok := in.Latest[o.Code]
		if !ok || o.EffectiveAt.After(cur.EffectiveAt) || (o.EffectiveAt.Equal(cur.EffectiveAt) && o.ID > cur.ID) {
			in.Latest[o.Code] = o
		}
	}
	return in
}

// Output is a skill's result, marshalled into an agent session's output.
// Fields a skill does not produce are omitted, except score (null for the
// trend) and the lists (empty, never null).
type Output struct {
	Skill string `json:"skill"`
	// Score is the NEWS2 total or the qSOFA score; nil for vitals_trend.
	Score *int `json:"score"`
	// Band is the NEWS2 risk band, or "positive"/"negative" for qSOFA.
	Band string `json:"band,omitempty"`
	// Severity is the workflow severity (NEWS2Result.Severity,
	// QSOFAResult.Severity; NONE for vitals_trend, which scores no risk).
	Severity Severity `json:"severity"`
	// RedScore (NEWS2): some single parameter scored 3.
	RedScore *bool `json:"redScore,omitempty"`
	// Positive (qSOFA): score ≥ 2.
	Positive *bool `json:"positive,omitempty"`
	// Response and Monitoring (NEWS2): RCP chart 3 response and chart 4
	// monitoring frequency.
	Response   string `json:"response,omitempty"`
	Monitoring string `json:"monitoring,omitempty"`
	// SpO2Scale (NEWS2): the SpO2 scale used.
	SpO2Scale int `json:"spo2Scale,omitempty"`
	// Window (vitals_trend): the window summarized.
	Window *Window `json:"window,omitempty"`

	Components      []Component `json:"components"`
	Recommendations []string    `json:"recommendations"`
	// ObservationIDs are the observations the output was computed from, in
	// component order, without duplicates.
	ObservationIDs []string `json:"observationIds"`
}

// Component is one scored parameter, qSOFA criterion or trended vital.
type Component struct {
	Name  string   `json:"name"`           // parameter, criterion or vital name
	Code  string   `json:"code,omitempty"` // LOINC of the observation read
	Value *float64 `json:"value,omitempty"`
	Unit  string   `json:"unit,omitempty"`
	// Text qualifies the value: "air"/"oxygen", an ACVPU level, "scale 2".
	Text string `json:"text,omitempty"`
	// Score is the points the component contributed to Output.Score.
	Score *int `json:"score,omitempty"`
	// Met (qSOFA) tells whether the criterion is met.
	Met           *bool       `json:"met,omitempty"`
	ObservationID string      `json:"observationId,omitempty"`
	Trend         *VitalTrend `json:"trend,omitempty"`
}

// registry holds the built-in skills; it is never written after package
// initialization.
var registry = map[string]Skill{
	SkillNEWS2:       news2Skill{},
	SkillQSOFA:       qsofaSkill{},
	SkillVitalsTrend: trendSkill{},
}

// Lookup returns the built-in skill with the given name ("news2", "qsofa",
// "vitals_trend"); names are case-sensitive.
func Lookup(name string) (Skill, bool) {
	s, ok := registry[name]
	return s, ok
}

// Names lists the built-in skills, sorted.
func Names() []string {
	out := make([]string, 0, len(registry))
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
