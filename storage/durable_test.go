package storage

import "testing"

func TestDurableMarkWithin(t *testing.T) {
	mark := DurableMark{Epoch: 7, Pos: 100}
	for _, c := range []struct {
		name               string
		mark, now          DurableMark
		durable, mayBeLost bool
	}{
		{"zero mark", DurableMark{}, DurableMark{Epoch: 7}, true, false},
		{"not flushed yet", mark, DurableMark{Epoch: 7, Pos: 99}, false, false},
		{"flushed to it", mark, DurableMark{Epoch: 7, Pos: 100}, true, false},
		{"flushed past it", mark, DurableMark{Epoch: 7, Pos: 5000}, true, false},
		{"restarted since", mark, DurableMark{Epoch: 8, Pos: 5000}, false, true},
		{"nothing known", mark, DurableMark{}, false, false},
	} {
		durable, lost := c.mark.Within(c.now)
		if durable != c.durable || lost != c.mayBeLost {
			t.Errorf("%s: %+v within %+v = %v, %v; want %v, %v", c.name, c.mark, c.now, durable, lost, c.durable, c.mayBeLost)
		}
	}
}
