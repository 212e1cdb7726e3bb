package storagetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"carehub/kernel/events"
	"carehub/kernel/jsonwire"
	"carehub/storage"
)

// hostilePayloads are payloads at the edges of what jsonwire.Storable accepts, the limits the
// API's doors apply before an event reaches the log.
func hostilePayloads() []string {
	deep := strings.Repeat(`{"a":`, jsonwire.MaxStorableDepth-1) + `[]` + strings.Repeat(`}`, jsonwire.MaxStorableDepth-1)
	return []string{
		`{"max":1.7976931348623157e308,"min":-1.7976931348623157E+308,"sub":5e-324,"neg":-4.9e-324}`,
		`{"long":` + strings.Repeat("9", jsonwire.MaxNumberLength) + `,"frac":0.` + strings.Repeat("0", jsonwire.MaxNumberLength-3) + `1}`,
		`{"zero":0e400,"negzero":-0.0,"e":1E-300,"big":123456789012345678901234567890e100}`,
		`{"pair":"\ud83d\ude00","lit":"\\ud800","esc":"\"\\\/\b\f\n\r\t","u":"\u00e9\u2028\uffff","raw":"é 中 😀"}`,
		`{"\ud83d\ude00":1,"":2,"a.b[0]":3,"\u00e9":4,"k\"q":5}`,
		deep,
		`{"arr":[` + strings.Repeat(`[],{},"",0,null,true,false,`, 100) + `1]}`,
	}
}

// testEventHostilePayloads: any payload Storable accepts is appended and read back, one at a
// time and in a batch large enough for a store's bulk path; random JSON is either appended or
// refused with storage.ErrUnstorable, never another error (which the log's writer would retry
// forever).
func testEventHostilePayloads(t *testing.T, s storage.EventLog) {
	rng := rand.New(rand.NewPCG(51, 1))
	var accepted, other []string
	for _, p := range hostilePayloads() {
		if err := jsonwire.Storable([]byte(p)); err != nil {
			t.Fatalf("a hostile payload is not Storable (%v): %.80s", err, p)
		}
		accepted = append(accepted, p)
	}
	for len(accepted) < 1200 {
		p := randomObject(rng, 0)
		if jsonwire.Storable([]byte(p)) == nil {
			accepted = append(accepted, p)
		} else if len(other) < 50 {
			other = append(other, p)
		}
	}
	evs := make([]events.Event, len(accepted))
	for i, p := range accepted {
		evs[i] = event("org_h", "prj_h", "hostile.payload", time.Duration(i)*time.Microsecond, i)
		evs[i].Payload = []byte(p)
	}
	for _, ev := range evs[:len(hostilePayloads())] {
		mustAppend(t, s, []events.Event{ev})
	}
	mustAppend(t, s, evs)
	if page := mustQuery(t, s, storage.EventQuery{OrgID: "org_h", ProjectID: "prj_h", Limit: 1}); page.Total != int64(len(evs)) {
		t.Errorf("stored %d of %d Storable payloads", page.Total, len(evs))
	}
	got, _ := queryAll(t, s, storage.EventQuery{OrgID: "org_h", ProjectID: "prj_h", Limit: 500})
	byID := map[string]events.Event{}
	for _, ev := range got {
		byID[ev.ID] = ev
	}
	for _, want := range evs[:len(hostilePayloads())] {
		if diff := sameEvent(byID[want.ID], want); diff != "" {
			t.Errorf("hostile payload %.60s: %s", want.Payload, diff)
		}
	}
	for i, p := range append(other, `{"n":1e999999}`, `{"s":"\ud800"}`, `{"\udc00":1}`, `{"n":`+strings.Repeat("7", 200000)+`}`) {
		ev := event("org_r", "prj_r", "refused.payload", time.Duration(i)*time.Microsecond, i)
		ev.Payload = []byte(p)
		if err := s.AppendEvents(ctxFor(t), []events.Event{ev}); err != nil && !errors.Is(err, storage.ErrUnstorable) {
			t.Errorf("AppendEvents(%.60s) = %v, want nil or storage.ErrUnstorable", p, err)
		}
	}
}

// randomObject returns a random JSON object, hostile in its numbers, escapes and nesting.
func randomObject(rng *rand.Rand, depth int) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := range rng.IntN(4) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(randomString(rng))
		b.WriteByte(':')
		b.WriteString(randomValue(rng, depth+1))
	}
	b.WriteByte('}')
	return b.String()
}

func randomValue(rng *rand.Rand, depth int) string {
	switch n := rng.IntN(10); {
	case n < 2 && depth < 6:
		return randomObject(rng, depth)
	case n < 3 && depth < 6:
		return "[" + randomValue(rng, depth+1) + "," + randomValue(rng, depth+1) + "]"
	case n < 6:
		return randomNumber(rng)
	case n < 9:
		return randomString(rng)
	}
	return []string{"true", "false", "null"}[rng.IntN(3)]
}

func randomNumber(rng *rand.Rand) string {
	digits := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteByte(byte('0' + rng.IntN(10)))
		}
		return strings.TrimLeft(b.String(), "0") + "1"
	}
	n := digits(1 + rng.IntN(30))
	if rng.IntN(2) == 0 {
		n = "-" + n
	}
	if rng.IntN(2) == 0 {
		n += "." + digits(1+rng.IntN(40))
	}
	if rng.IntN(2) == 0 {
		n += fmt.Sprintf("e%d", rng.IntN(800)-400)
	}
	return n
}

// randomString returns a JSON string of escapes, surrogates (paired or not) and text.
func randomString(rng *rand.Rand) string {
	parts := []string{`a`, `é`, `😀`, `\n`, `\"`, `\\`, `\/`, `\u00e9`, `\ud83d\ude00`, `\ud800`, `\udfff`, `\u0000`, `\u001f`, `\uffff`, ` `, `.`}
	var b strings.Builder
	b.WriteByte('"')
	for range rng.IntN(8) {
		b.WriteString(parts[rng.IntN(len(parts))])
	}
	b.WriteByte('"')
	return b.String()
}
