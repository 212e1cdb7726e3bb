package rest

import (
	"fmt"
	"reflect"
	"testing"
)

// FuzzWellFormedArray: whatever the one-pass decode of an array accepts, the element-wise
// decode accepts too, with the same drafts; so the fast path refuses nothing less and never
// answers differently.
func FuzzWellFormedArray(f *testing.F) {
	for _, seed := range []string{
		`[{"projectId":"prj_1","type":"a.b","payload":{}}]`,
		`[{"projectId":"p","type":"a.b","payload":{"x":[1,2,{"y":"z"}]}},{"type":"c.d","projectId":"q","payload":{}}]`,
		`[{"projectId":"p","type":"a.b","payload":{"v":null}}]`,
		`[{"PROJECTID":"p","type":"a.b","payload":{}}]`,
		`[{"projectId":"p","TYPE":null,"type":"a.b","payload":{}}]`,
		`[{"projectId":"p","type":"a.b","payload":7}]`,
		`[{"projectId":"p","type":"a.b","payload":{},"extra":1}]`,
		`[{"projectId":"p","type":"a.b"}]`,
		`[7]`, `[]`, `[{}] []`, `[{"projectId":"p","type":"a.b","payload":"{}"}]`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fast, ok := wellFormedArray(b)
		if !ok {
			return
		}
		slow, err := decodeElements(b)
		if err != nil {
			t.Fatalf("one pass accepted %q, element by element: %v", b, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%q: one pass %+v, element by element %+v", b, fast, slow)
		}
	})
}

// BenchmarkWellFormedArray: one body of 1,000 events, as eventload's arrays send them.
func BenchmarkWellFormedArray(b *testing.B) {
	var body []byte
	body = append(body, '[')
	for i := range 1000 {
		if i > 0 {
			body = append(body, ',')
		}
		body = fmt.Appendf(body, `{"projectId":"prj_01k6frjkp02mdsx778d87mnezy","type":"eventload.r1.bulk","payload":{"seq":%d,"client":3,"note":"a reading of the bench"}}`, i)
	}
	body = append(body, ']')
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, ok := wellFormedArray(body); !ok {
			b.Fatal("refused")
		}
	}
}
