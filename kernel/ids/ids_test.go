package ids

import "testing"

func TestValid(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{New(Event), true},
		{"evt_01ke5zfvg0yrnbhjm3vk8tvmc8", true},
		{"evt_01KE5ZFVG0YRNBHJM3VK8TVMC8", true}, // either case, as before
		{"evt_01Ke5zFvg0yrnbhjm3vk8tvmc8", true},
		{"prj_01ke5zfvg0yrnbhjm3vk8tvmc8", false}, // another kind's prefix
		{"evt_01ke5zfvg0yrnbhjm3vk8tvmc", false},  // too short
		{"evt_01ke5zfvg0yrnbhjm3vk8tvmc88", false},
		{"evt_01ke5zfvg0yrnbhjm3vk8tvmcu", false}, // u is not Crockford base32
		{"evt_81ke5zfvg0yrnbhjm3vk8tvmc8", false}, // over 2^128
		{"evt_", false},
	} {
		if got := Valid(Event, tc.id); got != tc.want {
			t.Errorf("Valid(%q) = %v, want %v", tc.id, got, tc.want)
		}
	}
}
