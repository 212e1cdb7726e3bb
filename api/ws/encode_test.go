package ws

import (
	"bytes"
	"encoding/json"
	"testing"

	gqlerrors "github.com/graph-gophers/graphql-go/errors"
)

// TestEncodeNextIsEncode: the spliced frame is byte for byte what marshalling the whole message
// writes, for every shape of result the executor hands over. The data is as graph-gophers writes
// it: compact, its values written by encoding/json (so <, > and & already escaped).
func TestEncodeNextIsEncode(t *testing.T) {
	errs := []*gqlerrors.QueryError{{Message: `bad "x" <y>`, Extensions: map[string]any{"code": "INTERNAL"}}}
	for _, r := range []*Response{
		{Data: json.RawMessage(`{"eventStream":{"id":"evt_1","payload":{"pad":"\u003c\u0026\u003e\u2028"}}}`)},
		{Data: json.RawMessage(`{"a":null}`), Errors: errs},
		{Data: json.RawMessage(`{"a":[1,2.5,"é"]}`), Extensions: map[string]any{"cost": 3}},
		{Data: json.RawMessage(`{"a":1}`), Errors: errs, Extensions: map[string]any{"cost": 3}},
		{Errors: errs},
		{},
	} {
		for _, id := range []string{"1", `sub "7" <é>`, ""} {
			for _, typ := range []string{typeNext, typeLegacyData} {
				want := encode(outMessage{ID: id, Type: typ, Payload: r})
				if got := encodeNext(id, typ, r); !bytes.Equal(got, want) {
					t.Errorf("id %q %s:\n got %s\nwant %s", id, typ, got, want)
				}
			}
		}
	}
}
