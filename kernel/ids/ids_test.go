package ids

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
)

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

func TestIDsAreLowerCaseULIDs(t *testing.T) {
	at := time.UnixMilli(1700000000123)
	id := ulid.MustNew(ulid.Timestamp(at), bytes.NewReader(make([]byte, 16)))
	if got, want := At(Event, at, bytes.NewReader(make([]byte, 16))), Event+strings.ToLower(id.String()); got != want {
		t.Errorf("At = %s, want %s", got, want)
	}
	a, b := New(Delivery), New(Delivery)
	if a >= b || !Valid(Delivery, a) || strings.ToLower(a) != a {
		t.Errorf("New gave %s then %s", a, b)
	}
}
