package clinical

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinels matched with errors.Is.
var (
	// ErrMissingInput: a required input was absent; the score was not computed.
	ErrMissingInput = errors.New("missing input")
	// ErrInvalidInput: an input was present but unusable (implausible value,
	// wrong unit, unknown option); the score was not computed.
	ErrInvalidInput = errors.New("invalid input")
	// ErrUnknownCode: a LOINC code outside VitalSigns.
	ErrUnknownCode = errors.New("unknown vital sign code")
)

// InputError reports everything wrong with a score's inputs at once, so a
// caller can fix them in one round: every missing parameter and every
// invalid one. It matches ErrMissingInput when Missing is non-empty and
// ErrInvalidInput when Invalid is non-empty.
type InputError struct {
	Skill   string         // "news2", "qsofa", "vitals_trend"
	Missing []string       // parameter names, e.g. "respiratory_rate", in a fixed order
	Invalid []InvalidValue // in the same fixed order
}

// InvalidValue is one unusable input.
type InvalidValue struct {
	Parameter string
	Reason    string // e.g. "spo2 104 % outside plausible range 0–100"
}

func (e *InputError) Error() string {
	var parts []string
	if len(e.Missing) > 0 {
		parts = append(parts, "missing "+strings.Join(e.Missing, ", "))
	}
	for _, iv := range e.Invalid {
		parts = append(parts, "invalid "+iv.Parameter+": "+iv.Reason)
	}
	return fmt.Sprintf("%s: %s", e.Skill, strings.Join(parts, "; "))
}

// Is makes errors.Is(err, ErrMissingInput) and errors.Is(err, ErrInvalidInput)
// work on an *InputError.
func (e *InputError) Is(target error) bool {
	switch target {
	case ErrMissingInput:
		return len(e.Missing) > 0
	case ErrInvalidInput:
		return len(e.Invalid) > 0
	}
	return false
}

// inputErrors collects problems while a score validates its inputs.
type inputErrors struct {
	skill   string
	missing []string
	invalid []InvalidValue
}

func (c *inputErrors) miss(param string) { c.missing = append(c.missing, param) }

func (c *inputErrors) bad(param, format string, args ...any) {
	c.invalid = append(c.invalid, InvalidValue{Parameter: param, Reason: fmt.Sprintf(format, args...)})
}

// err returns nil when nothing was collected. Returning a nil error interface
// (not a nil *InputError) matters to callers comparing with nil.
func (c *inputErrors) err() error {
	if len(c.missing) == 0 && len(c.invalid) == 0 {
		return nil
	}
	return &InputError{Skill: c.skill, Missing: c.missing, Invalid: c.invalid}
}
