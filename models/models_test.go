package models_test

import (
	"testing"

	"carehub/models"
)

func TestDeteriorationCases(t *testing.T) {
	cases, tolerance := models.DeteriorationCases()
	if len(cases) < 10 || tolerance <= 0 || tolerance > 1e-5 {
		t.Fatalf("%d cases, tolerance %g", len(cases), tolerance)
	}
	for _, c := range cases {
		if len(c.Input) != 5 || c.Output <= 0 || c.Output >= 1 || c.Name == "" {
			t.Errorf("case %+v", c)
		}
	}
}
