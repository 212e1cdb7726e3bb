package agents

import (
	"strings"
	"testing"
	"time"

	"carehub/kernel/clinical"
)

// TestFactsDeidentified: the de-identified context holds none of the patient's identifiers or
// dates (HIPAA Safe Harbor), groups ages of 90 and over, and gives readings' times as minutes
// ago; the identified one holds them.
func TestFactsDeidentified(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	f := &facts{id: "pat_7Hq2", name: "Ada Quill", gender: "female", birthDate: "1931-12-04", riskLevel: "HIGH",
		programs: []string{"sepsis-watch"},
		vitals: []clinical.Observation{{ID: "obs_1", Code: clinical.LOINCHeartRate, Value: 121, Unit: "/min",
			EffectiveAt: now.Add(-7 * time.Minute)}}}
	deid := f.text(now, true)
	for _, leak := range []string{"pat_7Hq2", "Ada", "Quill", "1931", "2026", "12-04", "obs_1"} {
		if strings.Contains(deid, leak) {
			t.Errorf("de-identified context holds %q:\n%s", leak, deid)
		}
	}
	for _, want := range []string{"female", "age 90 or older", "Heart rate: 121 /min (7 min ago)", "HIGH", "sepsis-watch"} {
		if !strings.Contains(deid, want) {
			t.Errorf("de-identified context lacks %q:\n%s", want, deid)
		}
	}
	full := f.text(now, false)
	for _, want := range []string{"pat_7Hq2", "Ada Quill", "born 1931-12-04 (age 94)", "2026-12-03T09:53:00Z"} {
		if !strings.Contains(full, want) {
			t.Errorf("identified context lacks %q:\n%s", want, full)
		}
	}
}

func TestAgeAt(t *testing.T) {
	now := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	for birth, want := range map[string]int{"2000-03-01": 26, "2000-03-02": 25, "2000-02-29": 26, "2000-07": 26, "1990": 36} {
		if got, ok := ageAt(birth, now); !ok || got != want {
			t.Errorf("ageAt(%q) = %d, %v; want %d", birth, got, ok, want)
		}
	}
	if _, ok := ageAt("soon", now); ok {
		t.Error("an unparsable birth date gave an age")
	}
}
