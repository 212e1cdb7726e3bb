package spectest

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// specBytes returns the spec the tests parse: the shared one when present, else the checked-in
// copy (LocateSpec decides).
func specBytes(t *testing.T) []byte {
	t.Helper()
	p, err := LocateSpec(".")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func loadSpec(t *testing.T) Model {
	t.Helper()
	m, err := LoadSpec("")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestParseSpecCounts(t *testing.T) {
	m := loadSpec(t)
	fieldCount := 0
	for _, o := range m.Objects {
		fieldCount += len(o.Fields)
	}
	for _, c := range []struct {
		what      string
		got, want int
	}{
		{"scalars", len(m.Scalars), 2},
		{"enums", len(m.Enums), 7},
		{"object types", len(m.Objects), 18},
		{"object type fields", fieldCount, 133},
		{"input types", len(m.Inputs), 1},
		{"SubmitAssetInput fields", len(m.Inputs[0].Fields), 10},
		{"query fields", len(m.Query), 15},
		{"mutation fields", len(m.Mutation), 9},
		{"subscription fields", len(m.Subscription), 4},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %d, want %d", c.what, c.got, c.want)
		}
	}
	if !slices.Equal(m.Scalars, []string{"DateTime", "JSON"}) {
		t.Errorf("scalars = %v, want [DateTime JSON]", m.Scalars)
	}
}

func TestParseSpecEnums(t *testing.T) {
	m := loadSpec(t)
	for name, want := range map[string][]string{
		"AssetType":        {"MODEL", "AGENT", "CONNECTOR", "DATASET", "SOLUTION", "APP"},
		"PricingType":      {"FREE", "USAGE_BASED", "SUBSCRIPTION", "ENTERPRISE"},
		"FHIRResourceType": {"Patient", "Observation", "DiagnosticReport", "Encounter", "Condition", "MedicationRequest", "CarePlan", "Device", "Practitioner"},
		"AssetStatus":      {"DRAFT", "UNDER_REVIEW", "APPROVED", "REJECTED", "DEPRECATED"},
		"DeploymentStatus": {"PENDING", "RUNNING", "DEGRADED", "STOPPED", "FAILED"},
		"WorkflowStatus":   {"ACTIVE", "PAUSED", "ARCHIVED"},
		"RunStatus":        {"QUEUED", "RUNNING", "COMPLETED", "FAILED", "CANCELLED"},
	} {
		e, ok := m.Enum(name)
		if !ok {
			t.Errorf("enum %s missing", name)
			continue
		}
		if !slices.Equal(e.Values, want) {
			t.Errorf("enum %s = %v, want %v", name, e.Values, want)
		}
	}
	// The REST-only webhook state set is not a GraphQL enum.
	for _, e := range m.Enums {
		if strings.Contains(strings.ToLower(e.Name), "webhook") {
			t.Errorf("unexpected enum %s from the REST webhook states", e.Name)
		}
	}
}

func TestParseSpecFieldRefs(t *testing.T) {
	m := loadSpec(t)
	objectField := func(typ, field string) string {
		o, ok := m.Object(typ)
		if !ok {
			return "<no type>"
		}
		f, ok := o.Field(field)
		if !ok {
			return "<no field>"
		}
		return f.Type
	}
	root := func(fs []Field, name string) Field {
		f, _ := findField(fs, name)
		return f
	}
	arg := func(f Field, name string) string {
		a, ok := f.Arg(name)
		if !ok {
			return "<no arg>"
		}
		return a.Type
	}
	inputField := func(name string) string {
		in, _ := m.Input("SubmitAssetInput")
		f, ok := in.Field(name)
		if !ok {
			return "<no field>"
		}
		return f.Type
	}
	assets := root(m.Query, "assets")
	eventStream := root(m.Subscription, "eventStream")
	for _, c := range []struct{ what, got, want string }{
		{"MarketplaceAsset.rating (nullable note)", objectField("MarketplaceAsset", "rating"), "Float"},
		{"MarketplaceAsset.badges", objectField("MarketplaceAsset", "badges"), "[String!]!"},
		{"Publisher.organization", objectField("Publisher", "organization"), "Organization"},
		{"Pricing.type", objectField("Pricing", "type"), "PricingType!"},
		{"Pricing.freeTierLimit (all but type nullable)", objectField("Pricing", "freeTierLimit"), "Int"},
		{"FHIRPatient.name", objectField("FHIRPatient", "name"), "[JSON!]!"},
		{"FHIRPatient.address", objectField("FHIRPatient", "address"), "[JSON!]"},
		{"FHIREncounter.class", objectField("FHIREncounter", "class"), "JSON!"},
		{"Event.timestamp", objectField("Event", "timestamp"), "DateTime!"},
		{"Query.organization", root(m.Query, "organization").Type, "Organization"},
		{"Query.organization(id:)", arg(root(m.Query, "organization"), "id"), "ID!"},
		{"Query.assets", assets.Type, "[MarketplaceAsset!]!"},
		{"Query.assets(status:)", arg(assets, "status"), "AssetStatus"},
		{"Query.assets(badges:)", arg(assets, "badges"), "[String!]"},
		{"Query.assets(offset:)", arg(assets, "offset"), "Int"},
		{"Query.assets args", strconv.Itoa(len(assets.Args)), "8"},
		{"Query.webhooks", root(m.Query, "webhooks").Type, "[WebhookSubscription!]!"},
		{"Mutation.submitAsset(input:)", arg(root(m.Mutation, "submitAsset"), "input"), "SubmitAssetInput!"},
		{"Mutation.createWorkflow(steps:)", arg(root(m.Mutation, "createWorkflow"), "steps"), "[String!]!"},
		{"Mutation.publishEvent", root(m.Mutation, "publishEvent").Type, "Event!"},
		{"Subscription.eventStream (remark stripped)", eventStream.Type, "Event!"},
		{"Subscription.eventStream(types:)", arg(eventStream, "types"), "[String!]"},
		{"SubmitAssetInput.name (required)", inputField("name"), "String!"},
		{"SubmitAssetInput.fhirResources (optional)", inputField("fhirResources"), "[String!]"},
		{"SubmitAssetInput.pricingType", inputField("pricingType"), "PricingType!"},
		{"SubmitAssetInput.monthlyFee", inputField("monthlyFee"), "Float"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %s, want %s", c.what, c.got, c.want)
		}
	}
}

// TestParseSpecRejects edits the spec so that a note contradicts a type, a section disappears or a
// type is undefined, and expects a parse error rather than a quietly wrong Model.
func TestParseSpecRejects(t *testing.T) {
	spec := string(specBytes(t))
	for _, c := range []struct {
		name, old, new, wantErr string
	}{
		{"nullable note on non-null type", "rating: Float (nullable)", "rating: Float! (nullable)", "noted nullable but typed Float!"},
		{"all-but note contradicted", "annualFee: Float,", "annualFee: Float!,", "Pricing.annualFee: noted nullable"},
		{"unknown note", "endpoint: String (nullable)", "endpoint: String (maybe)", `unknown note "maybe"`},
		{"undefined type", "publisher: Publisher!", "publisher: Publishr!", "Publishr! is not a defined output type"},
		{"object used as argument", "| createAgent | name: String!", "| createAgent | name: Agent!", "Agent! is not a defined input type"},
		{"optional input typed non-null", "| fhirResources | [String!] | no |", "| fhirResources | [String!]! | no |", "not required but typed [String!]!"},
		{"required column garbled", "| supportEmail | String | yes |", "| supportEmail | String | maybe |", `Required is "maybe"`},
		{"query section renamed", "**Query fields**", "**Query operations**", `"**Query fields**" not found`},
		{"objects section renamed", "### GraphQL object types", "### Object types", `"### GraphQL object types" not found`},
		{"scalars sentence missing", "Scalars: `DateTime`", "Scalar types: `DateTime`", "names no scalars"},
		{"malformed type", "| organization | id: ID! |", "| organization | id: [ID! |", `"[ID!" is not a type`},
		{"duplicate field", "slug: String!,", "slug: String!, slug: String!,", "Organization.slug defined twice"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseSpec([]byte(replaceOnce(t, spec, c.old, c.new)))
			if err == nil {
				t.Fatalf("ParseSpec accepted the edited spec, want error containing %q", c.wantErr)
			}
			if !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("error %q, want it to contain %q", err, c.wantErr)
			}
		})
	}
}

// TestSpecEditReachesCompare shows that the Model follows the spec text: a field added to a spec
// table becomes a difference against the unchanged schema.
func TestSpecEditReachesCompare(t *testing.T) {
	spec := replaceOnce(t, string(specBytes(t)),
		"| Organization | id: ID!, name: String!,", "| Organization | id: ID!, name: String!, tags: [String!]!,")
	m, err := ParseSpec([]byte(spec))
	if err != nil {
		t.Fatal(err)
	}
	got := Compare(m, introspectSchema(t, schemaSDL(t)))
	want := []string{"Organization.tags: missing field"}
	if !slices.Equal(got, want) {
		t.Fatalf("Compare = %q, want %q", got, want)
	}
}

// TestSpecCopyMatchesShared keeps testdata's copy of the spec identical to shared/spec, the
// authoritative one. Refresh with: cp ../shared/spec/clinical-ai-platform-api.md
// api/graphql/spectest/testdata/
func TestSpecCopyMatchesShared(t *testing.T) {
	root, err := ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	copyBytes, err := os.ReadFile(checkedInSpecPath(root))
	if err != nil {
		t.Fatalf("checked-in spec copy: %v", err)
	}
	shared, err := os.ReadFile(sharedSpecPath(root))
	if os.IsNotExist(err) {
		t.Skipf("%s absent; only the checked-in copy is available", sharedSpecPath(root))
	}
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(copyBytes, shared) {
		t.Fatalf("%s differs from %s; copy the shared spec over it", checkedInSpecPath(root), sharedSpecPath(root))
	}
}

func TestLocateSpec(t *testing.T) {
	spec := specBytes(t)
	write := func(t *testing.T, path string, b []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	newRepo := func(t *testing.T) (base, root, sub string) {
		base = t.TempDir()
		root = filepath.Join(base, "repo")
		sub = filepath.Join(root, "api", "graphql", "spectest")
		write(t, filepath.Join(root, "go.mod"), []byte("module x\n"))
		write(t, checkedInSpecPath(root), spec)
		return base, root, sub
	}

	t.Run("shared preferred", func(t *testing.T) {
		base, _, sub := newRepo(t)
		shared := filepath.Join(base, "shared", "spec", SpecFile)
		write(t, shared, spec)
		got, err := LocateSpec(sub)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Clean(got) != shared {
			t.Fatalf("LocateSpec = %s, want %s", got, shared)
		}
	})
	t.Run("checked-in copy without shared", func(t *testing.T) {
		_, root, sub := newRepo(t)
		got, err := LocateSpec(sub)
		if err != nil {
			t.Fatal(err)
		}
		if got != checkedInSpecPath(root) {
			t.Fatalf("LocateSpec = %s, want %s", got, checkedInSpecPath(root))
		}
		if _, err := LoadSpec(got); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("neither", func(t *testing.T) {
		_, root, sub := newRepo(t)
		if err := os.Remove(checkedInSpecPath(root)); err != nil {
			t.Fatal(err)
		}
		if got, err := LocateSpec(sub); err == nil {
			t.Fatalf("LocateSpec = %s, want error", got)
		}
	})
}

// replaceOnce replaces old, which must occur exactly once, so an edit never silently misses.
func replaceOnce(t *testing.T, s, old, new string) string {
	t.Helper()
	if n := strings.Count(s, old); n != 1 {
		t.Fatalf("%q occurs %d times, want once", old, n)
	}
	return strings.Replace(s, old, new, 1)
}
