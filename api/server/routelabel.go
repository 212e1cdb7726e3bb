package server

import "strings"

// routeLabel is a route's path template without the patterns of its variables
// (/fhir/R4/{type:[A-Z][A-Za-z]+}/{id} → /fhir/R4/{type}/{id}): the label of its metrics and
// access log lines, which a dashboard's query or a reader should not have to match a regex in.
func routeLabel(tpl string) string {
	if !strings.Contains(tpl, ":") {
		return tpl
	}
	var b strings.Builder
	depth, skip := 0, false
	for _, r := range tpl {
		switch {
		case r == '{':
			depth++
			if depth == 1 {
				skip = false
			}
		case r == '}':
			depth--
			if depth == 0 {
				skip = false
			}
		case r == ':' && depth == 1:
			skip = true
		}
		if !skip || depth == 0 {
			b.WriteRune(r)
		}
	}
	return b.String()
}
