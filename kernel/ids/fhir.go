package ids

import "strings"

// FHIR ids are [A-Za-z0-9\-\.]{1,64}; carehub's contain '_' (pat_01k…). The one mapping between
// them (DECISIONS §7, docs/FHIR.md): the '_' that ends the prefix becomes '-' (pat_01k… ↔
// pat-01k…). It is reversible because a prefix is lowercase letters and a ULID has no '-'.

// FHIR returns the FHIR id of carehub id id; an id without a prefix is returned as it is.
func FHIR(id string) string {
	if p, rest, ok := strings.Cut(id, "_"); ok && isPrefix(p) {
		return p + "-" + rest
	}
	return id
}

// FromFHIR returns the carehub id of a FHIR id; a carehub id (pat_…) is returned as it is, so
// input may use either form.
func FromFHIR(id string) string {
	if p, rest, ok := strings.Cut(id, "-"); ok && isPrefix(p) && !strings.Contains(p, "_") {
		return p + "_" + rest
	}
	return id
}

// isPrefix reports whether p is a prefix's letters (lowercase a-z, 1 to 8 of them).
func isPrefix(p string) bool {
	if len(p) == 0 || len(p) > 8 {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] < 'a' || p[i] > 'z' {
			return false
		}
	}
	return true
}
