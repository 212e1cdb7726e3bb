package config

import (
	"testing"
	"time"
)

func TestDefault(t *testing.T) {
	for _, tc := range []struct{ in, want time.Duration }{{0, time.Second}, {-1, time.Second}, {time.Minute, time.Minute}} {
		got := tc.in
		Default(&got, time.Second)
		if got != tc.want {
			t.Errorf("Default(%v, 1s) = %v, want %v", tc.in, got, tc.want)
		}
	}
	ratio := 0.25
	Default(&ratio, 0.5)
	if ratio != 0.25 {
		t.Errorf("a set ratio became %v", ratio)
	}
}

func TestDefaultString(t *testing.T) {
	for _, tc := range []struct{ in, want string }{{"", "def"}, {"set", "set"}} {
		got := tc.in
		Default(&got, "def")
		if got != tc.want {
			t.Errorf("Default(%q, def) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
