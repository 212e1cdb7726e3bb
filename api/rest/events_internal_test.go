package rest

import (
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
