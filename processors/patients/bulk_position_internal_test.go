package patients

import (
	"encoding/json"
	"reflect"
	"testing"
)

func at(s string) []*string { return []*string{&s} }

// TestExportPositionMoves: two lanes' parts, committed in any order, leave a position from which
// every type resumes where its last part ended, and Type counts the prefix written whole.
func TestExportPositionMoves(t *testing.T) {
	var p exportPosition
	p = p.moved(1, at("b1"), false) // lane 2 begins type 1 before lane 1 commits type 0
	p = p.moved(0, at("a1"), false)
	p = p.moved(1, nil, true) // type 1 done ahead of type 0
	p = p.moved(2, at("c1"), false)
	if p.Type != 0 || *p.After[0] != "a1" || !p.Ahead[1].Done || *p.Ahead[2].After[0] != "c1" || p.Written() != 1 {
		t.Fatalf("before type 0 ends: %+v", p)
	}
	// Through JSON, as the job row keeps it: a resumed runner sees the same.
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var back exportPosition
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, p) {
		t.Fatalf("through JSON: %s → %+v (%v)", b, back, err)
	}
	for k, want := range []struct {
		after string
		done  bool
	}{{"a1", false}, {"", true}, {"c1", false}, {"", false}} {
		after, done := p.of(k)
		if done != want.done || (want.after == "") != (after == nil) || (after != nil && *after[0] != want.after) {
			t.Errorf("type %d: at %v done %v, want %q %v", k, after, done, want.after, want.done)
		}
	}
	p = p.moved(0, nil, true) // type 0 ends: Type moves past the done type 1 to type 2's place
	if p.Type != 2 || *p.After[0] != "c1" || p.Ahead != nil || p.Written() != 2 {
		t.Fatalf("after type 0 ends: %+v", p)
	}
	p = p.moved(2, nil, true)
	if p.Type != 3 || p.After != nil || p.Written() != 3 {
		t.Fatalf("all three written: %+v", p)
	}
	// A job written by the runner before lanes: {"type", "after"} reads as it did.
	var old exportPosition
	if err := json.Unmarshal([]byte(`{"type":1,"after":["x"]}`), &old); err != nil {
		t.Fatal(err)
	}
	if after, done := old.of(1); done || *after[0] != "x" {
		t.Fatalf("an old position: %+v", old)
	}
	if _, done := old.of(0); !done {
		t.Fatal("an old position's earlier type is not done")
	}
}
