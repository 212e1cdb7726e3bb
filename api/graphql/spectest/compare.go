package spectest

import (
	"fmt"
	"sort"
	"strings"
)

// Compare reports, one human-readable line each, how the introspected schema departs from the
// spec: a missing type, field, argument, input field or enum value; a kind that differs; a type
// reference whose name, nullability or list shape differs (argument and input types included).
// Additive extensions are tolerated (extra types, fields, enum values, nullable or defaulted
// arguments), except an extra argument that is non-null without a default on a spec field, or an
// extra such input field on a spec input type: existing clients do not send it, so it breaks them.
// No differences yields nil. Lines follow the spec's order.
func Compare(spec Model, got IntrospectionResult) []string {
	var d []string
	add := func(format string, a ...any) { d = append(d, fmt.Sprintf(format, a...)) }

	kindOf := func(what, name, want string) *IntroType {
		t := got.Type(name)
		if t == nil {
			add("%s %s: missing type", what, name)
			return nil
		}
		if t.Kind != want {
			add("%s %s: kind is %s, want %s", what, name, t.Kind, want)
			return nil
		}
		return t
	}

	for _, s := range spec.Scalars {
		kindOf("scalar", s, "SCALAR")
	}
	for _, e := range spec.Enums {
		t := kindOf("enum", e.Name, "ENUM")
		if t == nil {
			continue
		}
		have := map[string]bool{}
		for _, v := range t.EnumValues {
			have[v.Name] = true
		}
		for _, v := range e.Values {
			if !have[v] {
				add("enum %s: missing value %s", e.Name, v)
			}
		}
	}
	for _, o := range spec.Objects {
		if t := kindOf("type", o.Name, "OBJECT"); t != nil {
			d = append(d, compareFields(o.Name, o.Fields, t)...)
		}
	}
	for _, in := range spec.Inputs {
		t := kindOf("input", in.Name, "INPUT_OBJECT")
		if t == nil {
			continue
		}
		have := map[string]IntroInputValue{}
		for _, f := range t.InputFields {
			have[f.Name] = f
		}
		want := map[string]bool{}
		for _, f := range in.Fields {
			want[f.Name] = true
			gf, ok := have[f.Name]
			switch {
			case !ok:
				add("%s.%s: missing input field", in.Name, f.Name)
			case gf.Type.String() != f.Type:
				add("%s.%s: type is %s, want %s", in.Name, f.Name, gf.Type.String(), f.Type)
			}
		}
		for _, gf := range t.InputFields {
			if !want[gf.Name] && required(gf) {
				add("%s.%s: extra required input field of type %s breaks existing clients", in.Name, gf.Name, gf.Type.String())
			}
		}
	}
	for _, r := range []struct {
		label  string
		fields []Field
		root   *IntroNamed
	}{
		{"Query", spec.Query, got.QueryType},
		{"Mutation", spec.Mutation, got.MutationType},
		{"Subscription", spec.Subscription, got.SubscriptionType},
	} {
		if len(r.fields) == 0 {
			continue
		}
		if r.root == nil {
			add("schema: no %s root type", strings.ToLower(r.label))
			continue
		}
		t := got.Type(r.root.Name)
		if t == nil || t.Kind != "OBJECT" {
			add("schema: %s root type %s is not an object type", strings.ToLower(r.label), r.root.Name)
			continue
		}
		d = append(d, compareFields(r.label, r.fields, t)...)
	}
	return d
}

func compareFields(owner string, fields []Field, t *IntroType) []string {
	var d []string
	add := func(format string, a ...any) { d = append(d, fmt.Sprintf(format, a...)) }
	for _, f := range fields {
		gf := t.Field(f.Name)
		if gf == nil {
			add("%s.%s: missing field", owner, f.Name)
			continue
		}
		if got := gf.Type.String(); got != f.Type {
			add("%s.%s: type is %s, want %s", owner, f.Name, got, f.Type)
		}
		have := map[string]IntroInputValue{}
		for _, a := range gf.Args {
			have[a.Name] = a
		}
		want := map[string]bool{}
		for _, a := range f.Args {
			want[a.Name] = true
			ga, ok := have[a.Name]
			switch {
			case !ok:
				add("%s.%s(%s:): missing argument", owner, f.Name, a.Name)
			case ga.Type.String() != a.Type:
				add("%s.%s(%s:): type is %s, want %s", owner, f.Name, a.Name, ga.Type.String(), a.Type)
			}
		}
		for _, ga := range gf.Args {
			if !want[ga.Name] && required(ga) {
				add("%s.%s(%s:): extra required argument of type %s breaks existing clients", owner, f.Name, ga.Name, ga.Type.String())
			}
		}
	}
	return d
}

// required reports whether a client must supply the value: non-null and without a default.
func required(v IntroInputValue) bool {
	return v.Type.Kind == "NON_NULL" && v.DefaultValue == nil
}

// Extension is one additive element of a schema beyond the spec, with its description.
type Extension struct {
	// Path names the element: "type WebhookDelivery", "enum RunStatus value X",
	// "Agent.skill", "Mutation.createAgent(skill:)", "SubmitAssetInput.tags".
	Path string
	// Signature is the element in SDL form: "skill: String!",
	// "updateWebhook(id: ID!, url: String): WebhookSubscription!", "TIMED_OUT",
	// "type WebhookAttempt { id: ID!, statusCode: Int }".
	Signature   string
	Description string
}

// Extensions lists what the introspected schema adds to the spec: types the spec does not define
// (their members are not listed separately), fields and enum values added to spec types, and
// arguments added to spec fields. Introspection types (__*) and built-in scalars are not
// extensions. The list is sorted by Path.
func Extensions(spec Model, got IntrospectionResult) []Extension {
	specTypes := map[string]bool{}
	for n := range builtinScalars {
		specTypes[n] = true
	}
	for _, s := range spec.Scalars {
		specTypes[s] = true
	}
	enums := map[string]Enum{}
	for _, e := range spec.Enums {
		specTypes[e.Name] = true
		enums[e.Name] = e
	}
	objects := map[string][]Field{}
	for _, o := range spec.Objects {
		specTypes[o.Name] = true
		objects[o.Name] = o.Fields
	}
	inputs := map[string]Input{}
	for _, in := range spec.Inputs {
		specTypes[in.Name] = true
		inputs[in.Name] = in
	}
	for _, r := range []struct {
		root   *IntroNamed
		fields []Field
	}{{got.QueryType, spec.Query}, {got.MutationType, spec.Mutation}, {got.SubscriptionType, spec.Subscription}} {
		if r.root != nil {
			specTypes[r.root.Name] = true
			objects[r.root.Name] = r.fields
		}
	}

	var out []Extension
	for _, t := range got.Types {
		if strings.HasPrefix(t.Name, "__") {
			continue
		}
		if !specTypes[t.Name] {
			out = append(out, Extension{Path: "type " + t.Name, Signature: typeSignature(t), Description: t.Description})
			continue
		}
		if e, ok := enums[t.Name]; ok {
			for _, v := range t.EnumValues {
				if !contains(e.Values, v.Name) {
					out = append(out, Extension{Path: "enum " + t.Name + " value " + v.Name, Signature: v.Name, Description: v.Description})
				}
			}
		}
		if in, ok := inputs[t.Name]; ok {
			for _, f := range t.InputFields {
				if _, ok := in.Field(f.Name); !ok {
					out = append(out, Extension{Path: t.Name + "." + f.Name, Signature: valueSignature(f), Description: f.Description})
				}
			}
		}
		fields, ok := objects[t.Name]
		if !ok {
			continue
		}
		for _, gf := range t.Fields {
			sf, ok := findField(fields, gf.Name)
			if !ok {
				out = append(out, Extension{Path: t.Name + "." + gf.Name, Signature: fieldSignature(gf), Description: gf.Description})
				continue
			}
			for _, ga := range gf.Args {
				if _, ok := sf.Arg(ga.Name); !ok {
					out = append(out, Extension{Path: fmt.Sprintf("%s.%s(%s:)", t.Name, gf.Name, ga.Name), Signature: valueSignature(ga), Description: ga.Description})
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

func valueSignature(v IntroInputValue) string {
	s := v.Name + ": " + v.Type.String()
	if v.DefaultValue != nil {
		s += " = " + *v.DefaultValue
	}
	return s
}

func fieldSignature(f IntroField) string {
	var b strings.Builder
	b.WriteString(f.Name)
	if len(f.Args) > 0 {
		args := make([]string, len(f.Args))
		for i, a := range f.Args {
			args[i] = valueSignature(a)
		}
		b.WriteString("(" + strings.Join(args, ", ") + ")")
	}
	b.WriteString(": " + f.Type.String())
	return b.String()
}

func typeSignature(t IntroType) string {
	var members []string
	switch t.Kind {
	case "OBJECT", "INTERFACE":
		for _, f := range t.Fields {
			members = append(members, fieldSignature(f))
		}
	case "INPUT_OBJECT":
		for _, f := range t.InputFields {
			members = append(members, valueSignature(f))
		}
	case "ENUM":
		for _, v := range t.EnumValues {
			members = append(members, v.Name)
		}
	}
	kw := map[string]string{"OBJECT": "type", "INTERFACE": "interface", "INPUT_OBJECT": "input",
		"ENUM": "enum", "SCALAR": "scalar", "UNION": "union"}[t.Kind]
	if len(members) == 0 {
		return kw + " " + t.Name
	}
	return kw + " " + t.Name + " { " + strings.Join(members, ", ") + " }"
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
