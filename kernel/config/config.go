// Package config holds what every component's configuration shares: how an unset field gets its
// default. A zero or negative duration, count, size or ratio is unset.
package config

// number is what a configuration field with a default is: a duration, a count, a size, a ratio.
type number interface {
	~int | ~int32 | ~int64 | ~float64
}

// Default sets *field to def when it is unset (zero or negative).
func Default[T number](field *T, def T) {
	if *field <= 0 {
		*field = def
	}
}
