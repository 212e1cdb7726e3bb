package clinical

// Severity is the level a workflow attaches to its run and its alerts
// (workflow.run.completed carries it upper-case). Scores map onto it with
// NEWS2Result.Severity and QSOFAResult.Severity.
type Severity string

// Severity levels, lowest first.
const (
	SeverityNone     Severity = "NONE"
	SeverityLow      Severity = "LOW"
	SeverityMedium   Severity = "MEDIUM"
	SeverityHigh     Severity = "HIGH"
	SeverityCritical Severity = "CRITICAL"
)

// Rank orders severities: NONE 0 … CRITICAL 4; an unknown value is -1, so
// it never outranks a real one.
func (s Severity) Rank() int {
	switch s {
	case SeverityNone:
		return 0
	case SeverityLow:
		return 1
	case SeverityMedium:
		return 2
	case SeverityHigh:
		return 3
	case SeverityCritical:
		return 4
	}
	return -1
}

// MaxSeverity returns the highest of the given severities (NONE for none),
// for a workflow that combines several skills.
func MaxSeverity(s ...Severity) Severity {
	out := SeverityNone
	for _, x := range s {
		if x.Rank() > out.Rank() {
			out = x
		}
	}
	return out
}
