// Package config holds what every component's configuration shares: how an unset field gets its
// default. A zero or negative duration, count, size or ratio is unset; so is an empty string.
package config

import "cmp"

// Default sets *field to def when it is unset (zero or negative; for a string, empty).
func Default[T cmp.Ordered](field *T, def T) {
	var zero T
	if *field <= zero {
		*field = def
	}
}
