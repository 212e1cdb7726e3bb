package clinical

import "unicode"

// Tokens approximates how many tokens an LLM's byte-pair-encoding tokenizer
// would make of s. carehub reports it as an agent session's tokensUsed
// (over the context and the output the agent processed), so it must be
// deterministic and cheap rather than exact for any one model.
//
// The rule: s is split into runs of one character class, and each run
// counts
//
//	letters (with combining marks)      ceil(n/4)  BPE merges about 4 characters of English per token
//	digits                              ceil(n/3)  GPT-style tokenizers split numbers into groups of up to 3 digits
//	Han, Hiragana, Katakana, Hangul     n          scripts without spaces: about one token per character
//	white space                         0          absorbed into the following token
//	anything else (punctuation, symbols, emoji, control)
//	                                    ceil(n/2)  common pairs such as `":` or `},` are single tokens
//
// where n counts Unicode code points (invalid UTF-8 bytes count as symbols).
// So "NEWS2 score: 7" is NEWS(1) 2(1) score(2) :(1) 7(1) = 6 tokens, and a
// word of up to 4 letters is one token.
func Tokens(s string) int {
	total := 0
	run, n := classNone, 0
	flush := func() {
		total += runTokens(run, n)
	}
	for _, r := range s {
		c := classify(r)
		if c == run {
			n++
			continue
		}
		flush()
		run, n = c, 1
	}
	flush()
	return total
}

type charClass int

const (
	classNone charClass = iota
	classSpace
	classLetter
	classDigit
	classIdeograph
	classOther
)

func classify(r rune) charClass {
	if r < 0x80 { // fast path: agent context is mostly ASCII JSON
		switch {
		case r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == '\v' || r == '\f':
			return classSpace
		case 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z':
			return classLetter
		case '0' <= r && r <= '9':
			return classDigit
		}
		return classOther
	}
	return classifyUnicode(r)
}

// classifyUnicode is the definition; classify's ASCII path must agree with it.
func classifyUnicode(r rune) charClass {
	switch {
	case unicode.IsSpace(r):
		return classSpace
	case unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Hangul):
		return classIdeograph
	case unicode.IsLetter(r) || unicode.IsMark(r):
		return classLetter
	case unicode.IsDigit(r):
		return classDigit
	}
	return classOther
}

func runTokens(c charClass, n int) int {
	switch c {
	case classLetter:
		return (n + 3) / 4
	case classDigit:
		return (n + 2) / 3
	case classIdeograph:
		return n
	case classOther:
		return (n + 1) / 2
	}
	return 0
}
