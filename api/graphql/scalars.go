package graphql

import (
	"encoding/json"
	"fmt"
	"time"

	"carehub/kernel/jsonwire"
)

// DateTime is the DateTime scalar: an RFC 3339 timestamp, written in UTC ("2024-05-01T12:00:00Z",
// with fractional seconds when there are any). Input accepts any RFC 3339 offset.
type DateTime struct{ time.Time }

// ImplementsGraphQLType binds DateTime to the schema's DateTime scalar.
func (DateTime) ImplementsGraphQLType(name string) bool { return name == "DateTime" }

// UnmarshalGraphQL reads an RFC 3339 string.
func (t *DateTime) UnmarshalGraphQL(input any) error {
	s, ok := input.(string)
	if !ok {
		return fmt.Errorf("DateTime must be an RFC 3339 string such as \"2024-05-01T12:00:00Z\", got %T", input)
	}
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return fmt.Errorf("DateTime must be an RFC 3339 string such as \"2024-05-01T12:00:00Z\": %q", s)
	}
	t.Time = v.UTC()
	return nil
}

// MarshalJSON writes the time in UTC.
func (t DateTime) MarshalJSON() ([]byte, error) {
	return []byte(`"` + t.UTC().Format(time.RFC3339Nano) + `"`), nil
}

func dateTime(t time.Time) DateTime { return DateTime{t.UTC()} }

func optDateTime(t *time.Time) *DateTime {
	if t == nil {
		return nil
	}
	d := dateTime(*t)
	return &d
}

// JSON is the JSON scalar: any JSON value, kept as its encoding.
type JSON struct{ raw json.RawMessage }

// ImplementsGraphQLType binds JSON to the schema's JSON scalar.
func (JSON) ImplementsGraphQLType(name string) bool { return name == "JSON" }

// UnmarshalGraphQL takes the decoded input value (from variables or a literal) and keeps its JSON.
func (j *JSON) UnmarshalGraphQL(input any) error {
	b, err := json.Marshal(input)
	if err != nil {
		return fmt.Errorf("JSON value cannot be encoded: %v", err)
	}
	// A value a store cannot hold (a number past a double, from a variable decoded as a
	// json.Number) would reach an event or a jsonb column and fail there.
	if err := jsonwire.Storable(b); err != nil {
		return fmt.Errorf("JSON value cannot be stored: %v", err)
	}
	j.raw = b
	return nil
}

// MarshalJSON writes the value as it is.
func (j JSON) MarshalJSON() ([]byte, error) {
	if len(j.raw) == 0 {
		return []byte("null"), nil
	}
	return j.raw, nil
}

// Raw returns the encoding; nil for an absent value.
func (j *JSON) Raw() json.RawMessage {
	if j == nil {
		return nil
	}
	return j.raw
}

// optJSON returns nil (GraphQL null) for an absent or null value.
func optJSON(raw json.RawMessage) *JSON {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return &JSON{raw: raw}
}

// jsonList splits a JSON array into its elements; anything else gives nil.
func jsonList(raw json.RawMessage) []JSON {
	var items []json.RawMessage
	if len(raw) == 0 || json.Unmarshal(raw, &items) != nil {
		return nil
	}
	out := make([]JSON, 0, len(items))
	for _, it := range items {
		out = append(out, JSON{raw: it})
	}
	return out
}
