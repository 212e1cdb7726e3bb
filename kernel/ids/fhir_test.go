package ids

import "testing"

func TestFHIRMapping(t *testing.T) {
	for _, tc := range []struct{ carehub, fhir string }{
		{"pat_01ke5zfvg0yrnbhjm3vk8tvmc8", "pat-01ke5zfvg0yrnbhjm3vk8tvmc8"},
		{"obs_01ke5zfvg0yrnbhjm3vk8tvmc8", "obs-01ke5zfvg0yrnbhjm3vk8tvmc8"},
		{"rpt_01ke5zfvg0yrnbhjm3vk8tvmc8", "rpt-01ke5zfvg0yrnbhjm3vk8tvmc8"},
		{"example", "example"},     // no prefix: unchanged both ways
		{"Example_1", "Example_1"}, // not a carehub prefix (uppercase)
	} {
		if got := FHIR(tc.carehub); got != tc.fhir {
			t.Errorf("FHIR(%q) = %q, want %q", tc.carehub, got, tc.fhir)
		}
		if got := FromFHIR(tc.fhir); got != tc.carehub {
			t.Errorf("FromFHIR(%q) = %q, want %q", tc.fhir, got, tc.carehub)
		}
		if got := FromFHIR(tc.carehub); got != tc.carehub {
			t.Errorf("FromFHIR(%q) (carehub form) = %q, want it unchanged", tc.carehub, got)
		}
	}
	id := New(Patient)
	if FromFHIR(FHIR(id)) != id {
		t.Errorf("round trip of %s failed", id)
	}
}
