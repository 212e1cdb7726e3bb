package graphql

import (
	"carehub/kernel/fault"
)

// Pagination of list fields (spec and DECISIONS §3): limit defaults to 20 and must be 1..100,
// offset defaults to 0 and must not be negative. Out of range is BAD_USER_INPUT, never clamped.
const (
	DefaultLimit = 20
	MaxLimit     = 100
)

// limitArg returns *limit, or def when absent; a value outside 1..max is an Invalid fault.
func limitArg(limit *int32, def, max int) (int, error) {
	if limit == nil {
		return def, nil
	}
	if *limit < 1 || int(*limit) > max {
		return 0, fault.Invalid("limit must be between 1 and %d, got %d", max, *limit)
	}
	return int(*limit), nil
}

// pageArgs validates limit and offset with the defaults above.
func pageArgs(limit, offset *int32) (int, int, error) {
	l, err := limitArg(limit, DefaultLimit, MaxLimit)
	if err != nil {
		return 0, 0, err
	}
	if offset == nil {
		return l, 0, nil
	}
	if *offset < 0 {
		return 0, 0, fault.Invalid("offset must not be negative, got %d", *offset)
	}
	return l, int(*offset), nil
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
