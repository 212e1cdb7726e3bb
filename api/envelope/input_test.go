package envelope

import "testing"

// A JSON Schema integer is any number without a fraction; a fraction is still refused.
func TestDecodeObjectIntegralNumbers(t *testing.T) {
	type body struct {
		Days  *int    `json:"days"`
		Ratio float64 `json:"ratio"`
		List  []int64 `json:"list"`
	}
	for _, text := range []string{`{"days": 280.0, "ratio": 0.5}`, `{"days": 2.8e2, "list": [1.0, 2]}`, `{"days": 280}`} {
		var b body
		if err := DecodeObject([]byte(text), &b); err != nil || b.Days == nil || *b.Days != 280 {
			t.Errorf("%s: %v, days %v", text, err, b.Days)
		}
	}
	for _, text := range []string{`{"days": 280.5}`, `{"days": 1e300}`, `{"days": "280"}`, `{"days": 280.0, "other": 1}`, `{"days": 1} {}`} {
		var b body
		if err := DecodeObject([]byte(text), &b); err == nil {
			t.Errorf("%s: accepted", text)
		}
	}
}
