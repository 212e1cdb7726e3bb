package clinical

import "testing"

func f(x float64) *float64 { return &x }

func b(x bool) *bool { return &x }

func lvl(c Consciousness) *Consciousness { return &c }

// normal is a set of vitals scoring 0 on every NEWS2 parameter.
func normal() Vitals {
	return Vitals{
		RespiratoryRate: f(16),
		SpO2:            f(98),
		OnOxygen:        b(false),
		SystolicBP:      f(120),
		HeartRate:       f(70),
		Consciousness:   lvl(Alert),
		Temperature:     f(37.0),
	}
}

func mustNEWS2(t *testing.T, v Vitals) NEWS2Result {
	t.Helper()
	r, err := NEWS2(v)
	if err != nil {
		t.Fatalf("NEWS2: %v", err)
	}
	return r
}
