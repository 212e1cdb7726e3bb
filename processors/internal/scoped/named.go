package scoped

import "strings"

// NamedFields trims *name and checks the rules the named resources of a project (agents,
// workflows) share, so that they cannot drift apart: a name of 1 to 200 characters and a
// description of at most 2000. It returns the fields that break them, for the caller to add its
// own to before fault.Validation.
func NamedFields(name *string, description string) map[string]string {
	*name = strings.TrimSpace(*name)
	bad := map[string]string{}
	if *name == "" || len(*name) > 200 {
		bad["name"] = "must be 1 to 200 characters"
	}
	if len(description) > 2000 {
		bad["description"] = "must be at most 2000 characters"
	}
	return bad
}
