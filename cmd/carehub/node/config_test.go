package node

import (
	"os"
	"regexp"
	"testing"
)

// The Makefile's DATA_DIR and the commands' --data-dir default are one value: a key made with
// `bin/carehub keys create` (no --data-dir) must land in the database `make run` serves.
func TestMakefileDataDir(t *testing.T) {
	mk, err := os.ReadFile("../../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^DATA_DIR\s*\?=\s*(\S+)\s*$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile: no `DATA_DIR ?= …` line")
	}
	if got := string(m[1]); got != DefaultDataDir {
		t.Errorf("Makefile DATA_DIR = %s, commands default to %s", got, DefaultDataDir)
	}
	if got := Defaults().DataDir; got != DefaultDataDir {
		t.Errorf("Defaults().DataDir = %s, want %s", got, DefaultDataDir)
	}
}
