package clinical

import (
	"strings"
	"testing"
)

func TestTokens(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"", 0},
		{"   \n\t", 0},
		{"a", 1},
		{"word", 1},            // ≤ 4 letters: 1
		{"words", 2},           // 5 letters: ceil(5/4)
		{"abcdefgh", 2},        // 8: 2
		{"abcdefghi", 3},       // 9: 3
		{"7", 1},               // digits: ceil(n/3)
		{"120", 1},             //
		{"1200", 2},            //
		{"1234567", 3},         //
		{"36.8", 3},            // 36 . 8
		{".", 1},               // punctuation: ceil(n/2)
		{"...", 2},             //
		{`":{"`, 2},            //
		{"NEWS2 score: 7", 6},  // NEWS 2 score(2) : 7 — the doc comment's example
		{"heart_rate", 4},      // heart(2) _ rate
		{"Müller", 2},          // 6 letters, counted as runes not bytes
		{"e\u0301te\u0301", 2}, // combining marks join the word: 5 runes
		{"血圧", 2},              // one token per Han character
		{"日本語のテキスト", 8},        // Han, Hiragana, Katakana
		{"🙂🙂", 1},              // symbols pair up like punctuation
		{"hi 🙂", 2},
		{"\xff\xfe", 1}, // invalid UTF-8 bytes are symbols
		// {" score ": 7 ," band ":" high "} = 1+2+1+1+1+1+2+1+1
		{`{"score":7,"band":"high"}`, 11},
	} {
		if got := Tokens(tc.in); got != tc.want {
			t.Errorf("Tokens(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestTokensProperties(t *testing.T) {
	s := `{"skill":"news2","score":10,"band":"high","recommendations":["Registered nurse to immediately inform the medical team"]}`
	// Deterministic, and additive over a white-space boundary.
	if Tokens(s) != Tokens(s) {
		t.Error("not deterministic")
	}
	if got, want := Tokens(s+" "+s), 2*Tokens(s); got != want {
		t.Errorf("Tokens(s s) = %d, want 2×%d", got, Tokens(s))
	}
	// Never more tokens than code points, never zero for visible text.
	long := strings.Repeat("pneumonia 38.9 °C; ", 50)
	if n := Tokens(long); n <= 0 || n > len([]rune(long)) {
		t.Errorf("Tokens(long) = %d, outside (0, %d]", n, len([]rune(long)))
	}
}

func TestClassifyASCIIFastPath(t *testing.T) {
	for r := rune(0); r < 0x80; r++ {
		if got, want := classify(r), classifyUnicode(r); got != want {
			t.Errorf("classify(%q) = %d, unicode says %d", r, got, want)
		}
	}
}

func BenchmarkTokens(b *testing.B) {
	s := strings.Repeat(`{"name":"respiratory_rate","code":"9279-1","value":24,"unit":"/min","score":2} `, 20)
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		Tokens(s)
	}
}
