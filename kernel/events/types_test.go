package events_test

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"carehub/kernel/events"
)

// jsonType is the catalogue field type a Go payload field encodes as.
func jsonType(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeFor[time.Time]():
		return events.FieldDateTime
	case t.Kind() == reflect.String:
		return events.FieldString
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return events.FieldInteger
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return events.FieldNumber
	case t.Kind() == reflect.Bool:
		return events.FieldBoolean
	case t.Kind() == reflect.Map || t.Kind() == reflect.Struct:
		return events.FieldObject
	case t.Kind() == reflect.Slice:
		return events.FieldArray
	}
	return "unknown " + t.String()
}

// TestPayloadsMatchSchemas checks every payload struct against the committed schema of its type
// (schemas/kafka/event-types.json, which TestCatalogueFile keeps equal to the catalogue): the
// same JSON names, required exactly where the tag has no omitempty, and matching types. Every
// catalogued type has a payload struct and a constant.
func TestPayloadsMatchSchemas(t *testing.T) {
	data, err := os.ReadFile(catalogueFile)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Types []events.EventType `json:"eventTypes"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Types) != len(events.Payloads) {
		t.Errorf("%s has %d types, events.Payloads %d", catalogueFile, len(file.Types), len(events.Payloads))
	}
	for _, et := range file.Types {
		t.Run(et.Type, func(t *testing.T) {
			p, ok := events.Payloads[et.Type]
			if !ok {
				t.Fatalf("no payload struct for %s", et.Type)
			}
			want := map[string]events.Field{}
			for _, f := range et.Payload {
				want[f.Name] = f
			}
			rt := reflect.TypeOf(p)
			for i := range rt.NumField() {
				sf := rt.Field(i)
				name, opts, _ := strings.Cut(sf.Tag.Get("json"), ",")
				f, ok := want[name]
				if !ok {
					t.Errorf("%s.%s (json %q) is not a field of %s", rt.Name(), sf.Name, name, et.Type)
					continue
				}
				delete(want, name)
				if got := jsonType(sf.Type); got != f.Type {
					t.Errorf("%s.%s encodes as %s, the schema says %s", rt.Name(), sf.Name, got, f.Type)
				}
				if omit := strings.Contains(opts, "omitempty"); omit == f.Required {
					t.Errorf("%s.%s: omitempty %v, but required is %v", rt.Name(), sf.Name, omit, f.Required)
				}
			}
			for name := range want {
				t.Errorf("%s lacks the field %q of %s", rt.Name(), name, et.Type)
			}
		})
	}
}
