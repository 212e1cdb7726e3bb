// Package clinical is carehub's library of built-in clinical skills: pure
// functions over a patient's vital-sign observations, with no I/O, no clock
// and no logging, so that the same inputs always give the same output and the
// agents and workflows that call it can replay a session exactly.
//
// # Scores and their sources
//
//   - NEWS2, the National Early Warning Score 2: Royal College of Physicians.
//     National Early Warning Score (NEWS) 2: Standardising the assessment of
//     acute-illness severity in the NHS. Updated report of a working party.
//     London: RCP, 2017. Chart 1 (the scoring system), chart 3 (thresholds
//     and triggers: clinical risk bands) and chart 4 (clinical response) are
//     implemented in news2.go.
//   - qSOFA, the quick Sequential Organ Failure Assessment: Singer M,
//     Deutschman CS, Seymour CW, et al. The Third International Consensus
//     Definitions for Sepsis and Septic Shock (Sepsis-3). JAMA.
//     2016;315(8):801-810. Implemented in qsofa.go.
//   - The vitals trend summary (trend.go) is carehub's own: least-squares
//     slope per vital with a per-vital tolerance from the VitalSigns table.
//
// NEWS2 is validated for adults (16 years and over) and the RCP warns
// against its use in pregnancy and in children; this package cannot see age
// or pregnancy, so callers that know them decide whether a score applies.
// The scores support, and never replace, clinical judgement.
//
// # Missing and invalid data
//
// A score is never computed from fabricated data. A required vital that is
// absent is reported in an *InputError listing every missing parameter (and
// every invalid one) at once; errors.Is(err, ErrMissingInput) and
// errors.Is(err, ErrInvalidInput) tell the two apart.
//
// # Files
//
//	vitals.go    LOINC codes, the VitalSigns table, unit normalization
//	news2.go     NEWS2 scoring, risk bands, RCP clinical response
//	qsofa.go     qSOFA
//	trend.go     vitals trend summary
//	severity.go  Severity (NONE … CRITICAL) and its mapping from scores
//	tokens.go    Tokens, the tokenizer behind agent sessions' tokensUsed
//	skill.go     Skill, Input, Output and the registry (Lookup, Names)
//	skills.go    the news2, qsofa and vitals_trend skills
//	errors.go    InputError and its sentinels
package clinical
