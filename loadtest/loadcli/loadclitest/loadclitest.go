// Package loadclitest runs the load tools' command-line validation tables: each case edits a
// valid configuration and names the flag its error must mention.
package loadclitest

import (
	"strings"
	"testing"
)

// Case is one edit of a valid configuration and the text its error must contain ("" when the
// edited configuration is still valid).
type Case[C any] struct {
	Name string
	Edit func(*C)
	Want string
}

// Validate runs validate on ok() edited by each case.
func Validate[C any](t *testing.T, ok func() C, validate func(*C) error, cases []Case[C]) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			c := ok()
			tc.Edit(&c)
			err := validate(&c)
			switch {
			case tc.Want == "" && err != nil:
				t.Fatalf("want valid, got %v", err)
			case tc.Want != "" && (err == nil || !strings.Contains(err.Error(), tc.Want)):
				t.Fatalf("want an error naming %q, got %v", tc.Want, err)
			}
		})
	}
}
