package envelope

import (
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"carehub/kernel/fault"
)

// Query reads and validates a request's query parameters, collecting every problem for one 400
// INVALID_REQUEST. A parameter given with an empty value (?limit=) is given: for a number, a
// timestamp or an enumeration it is an error, as the OpenAPI document's types say; for free text
// it is the empty string, which filters nothing. A parameter that is not a list may appear once.
// StrictInput has already refused malformed query strings, NUL and invalid UTF-8.
type Query struct {
	v   url.Values
	bad []string
}

// NewQuery reads r's query string. A query string that does not parse (which StrictInput has
// normally refused already) is an error at Err.
func NewQuery(r *http.Request) *Query {
	v, err := url.ParseQuery(r.URL.RawQuery)
	q := &Query{v: v}
	if err != nil {
		q.bad = append(q.bad, "malformed query string")
	}
	return q
}

// one returns the single value of name, verbatim, and whether it was given.
func (q *Query) one(name string) (string, bool) {
	vs, ok := q.v[name]
	if !ok {
		return "", false
	}
	if len(vs) > 1 {
		q.bad = append(q.bad, name+" may be given once")
	}
	return vs[0], true
}

// typed returns the single value of name without surrounding spaces, for a number, a timestamp
// or an enumeration, whose spaces carry nothing.
func (q *Query) typed(name string) (string, bool) {
	s, ok := q.one(name)
	return strings.TrimSpace(s), ok
}

// Str returns the text parameter name as given, "" when absent.
func (q *Query) Str(name string) string {
	s, _ := q.one(name)
	return s
}

// Required returns the text parameter name, which must be given and not empty.
func (q *Query) Required(name string) string {
	s := q.Str(name)
	if s == "" {
		q.bad = append(q.bad, name+" is required")
	}
	return s
}

// FindProject tells a client without a project id where to get one.
const FindProject = "list your projects with GET /v1/projects"

// ProjectID returns the required projectId parameter; its absence is an error that says how to
// find one.
func (q *Query) ProjectID() string {
	s := q.Str("projectId")
	if s == "" {
		q.bad = append(q.bad, "projectId is required ("+FindProject+")")
	}
	return s
}

// Int returns the integer parameter name, def when absent; outside lo..hi it is an error.
func (q *Query) Int(name string, def, lo, hi int) int {
	s, ok := q.typed(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		q.bad = append(q.bad, fmt.Sprintf("%s must be an integer from %d to %d", name, lo, hi))
		return def
	}
	return n
}

// Float returns the number parameter name, nil when absent.
func (q *Query) Float(name string) *float64 {
	s, ok := q.typed(name)
	if !ok {
		return nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) { // not JSON numbers
		q.bad = append(q.bad, name+" must be a number")
		return nil
	}
	return &f
}

// Time returns the RFC 3339 timestamp parameter name in UTC, the zero time when absent.
func (q *Query) Time(name string) time.Time {
	s, ok := q.typed(name)
	if !ok {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		q.bad = append(q.bad, name+" must be an RFC 3339 timestamp such as 2026-05-01T12:00:00Z")
		return time.Time{}
	}
	return t.UTC()
}

// From reads the inclusive start of a time range: from, or since, which every route with a
// range takes as its synonym (DECISIONS §8), so a query copied from one route to another works.
// Both given must name the same time.
func (q *Query) From() (time.Time, error) {
	from, since := q.Time("from"), q.Time("since")
	if !from.IsZero() && !since.IsZero() && !from.Equal(since) {
		return from, fault.Invalid("invalid query parameters: since is a synonym of from; give one of them (or both equal)")
	}
	if from.IsZero() {
		return since, nil
	}
	return from, nil
}

// Enum returns the parameter name matched case-insensitively against values, as spelled in
// values; "" when absent. Any other value, the empty one included, is an error listing them in
// lowercase, as the OpenAPI document does.
func (q *Query) Enum(name string, values ...string) string {
	s, ok := q.typed(name)
	if !ok {
		return ""
	}
	for _, v := range values {
		if strings.EqualFold(s, v) {
			return v
		}
	}
	q.bad = append(q.bad, fmt.Sprintf("%s must be one of %s", name, strings.ToLower(strings.Join(values, ", "))))
	return ""
}

// List returns a repeatable, comma-separable parameter: ?badges=HIPAA&badges=SOC%202 or
// ?badges=HIPAA,SOC%202.
func (q *Query) List(name string) []string {
	var out []string
	for _, v := range q.v[name] {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

// Err is the 400 INVALID_REQUEST listing every problem found, or nil.
func (q *Query) Err() error {
	if len(q.bad) == 0 {
		return nil
	}
	return fault.Invalid("invalid query parameters: %s", strings.Join(q.bad, "; "))
}
