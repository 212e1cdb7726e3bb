package spectest

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/extensions.golden from schemas/graphql/schema.graphql")

const extensionMarker = "(carehub extension)"

func schemaSDL(t *testing.T) string {
	t.Helper()
	root, err := ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "schemas", "graphql", "schema.graphql"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func introspectSchema(t *testing.T, sdl string) IntrospectionResult {
	t.Helper()
	r, err := IntrospectSDL(sdl)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestSchemaMatchesSpec is the contract check: schemas/graphql/schema.graphql, parsed by
// graph-gophers/graphql-go and introspected, has every spec type, field, argument and enum value
// with the spec's type references.
func TestSchemaMatchesSpec(t *testing.T) {
	for _, d := range Compare(loadSpec(t), introspectSchema(t, schemaSDL(t))) {
		t.Error(d)
	}
}

func TestSchemaVersion(t *testing.T) {
	sdl := schemaSDL(t)
	if first, _, _ := strings.Cut(sdl, "\n"); first != "# carehub GraphQL API, schema version 2.0" {
		t.Errorf("first line = %q, want the version header", first)
	}
	r := introspectSchema(t, sdl)
	f := r.Type(r.QueryType.Name).Field("apiVersion")
	if f == nil {
		t.Fatal("Query.apiVersion missing")
	}
	if f.Type.String() != "String!" || len(f.Args) != 0 {
		t.Errorf("Query.apiVersion: type %s with %d args, want String! without args", f.Type, len(f.Args))
	}
	if !strings.Contains(f.Description, `"2.0"`) {
		t.Errorf("Query.apiVersion description %q does not state \"2.0\"", f.Description)
	}
}

// TestSchemaDescriptions requires a description on every type, field and input field of the
// schema, so introspection and the explorer document the whole API.
func TestSchemaDescriptions(t *testing.T) {
	r := introspectSchema(t, schemaSDL(t))
	n := 0
	for _, typ := range r.Types {
		if strings.HasPrefix(typ.Name, "__") || builtinScalars[typ.Name] {
			continue
		}
		n++
		if strings.TrimSpace(typ.Description) == "" {
			t.Errorf("type %s has no description", typ.Name)
		}
		for _, f := range typ.Fields {
			if strings.TrimSpace(f.Description) == "" {
				t.Errorf("%s.%s has no description", typ.Name, f.Name)
			}
		}
		for _, f := range typ.InputFields {
			if strings.TrimSpace(f.Description) == "" {
				t.Errorf("%s.%s has no description", typ.Name, f.Name)
			}
		}
	}
	if n < 20 {
		t.Fatalf("only %d schema types checked; introspection lost descriptions or types", n)
	}
}

// TestSchemaExtensions pins the additive surface beyond the spec, signatures included
// (testdata/extensions.golden; regenerate with
// go test ./api/graphql/spectest -run TestSchemaExtensions -update), and requires each extension
// to say so in its description.
func TestSchemaExtensions(t *testing.T) {
	exts := Extensions(loadSpec(t), introspectSchema(t, schemaSDL(t)))
	var lines []string
	for _, e := range exts {
		lines = append(lines, e.Path+"  "+e.Signature)
		if !strings.Contains(e.Description, extensionMarker) {
			t.Errorf("%s: description %q lacks %q", e.Path, e.Description, extensionMarker)
		}
	}
	golden := filepath.Join("testdata", "extensions.golden")
	got := strings.Join(lines, "\n") + "\n"
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("extensions differ from %s (rerun with -update if intended):\ngot:\n%swant:\n%s", golden, got, want)
	}
}

// TestSchemaMarkersOnlyOnExtensions keeps the marker honest: a spec element described as an
// extension would mislead readers.
func TestSchemaMarkersOnlyOnExtensions(t *testing.T) {
	spec := loadSpec(t)
	r := introspectSchema(t, schemaSDL(t))
	isExt := map[string]bool{}
	for _, e := range Extensions(spec, r) {
		isExt[e.Path] = true
	}
	for _, o := range append(spec.Objects, Object{Name: r.QueryType.Name, Fields: spec.Query},
		Object{Name: r.MutationType.Name, Fields: spec.Mutation},
		Object{Name: r.SubscriptionType.Name, Fields: spec.Subscription}) {
		typ := r.Type(o.Name)
		if typ == nil {
			t.Fatalf("type %s missing", o.Name)
		}
		for _, f := range o.Fields {
			gf := typ.Field(f.Name)
			if gf == nil {
				t.Fatalf("%s.%s missing", o.Name, f.Name)
			}
			if strings.Contains(gf.Description, extensionMarker) {
				t.Errorf("spec field %s.%s is described as an extension", o.Name, f.Name)
			}
			for _, a := range gf.Args {
				path := o.Name + "." + f.Name + "(" + a.Name + ":)"
				if !isExt[path] && strings.Contains(a.Description, extensionMarker) {
					t.Errorf("spec argument %s is described as an extension", path)
				}
			}
		}
	}
}

// TestCompareDetectsDrift edits the schema the way a careless change would and expects exactly the
// matching difference, so the contract check cannot pass vacuously.
func TestCompareDetectsDrift(t *testing.T) {
	spec := loadSpec(t)
	sdl := schemaSDL(t)
	for _, c := range []struct {
		name, old, new string
		want           []string
	}{
		{"field renamed", "  slug: String!\n", "  slugs: String!\n",
			[]string{"Organization.slug: missing field"}},
		{"output made non-null", "  rating: Float\n", "  rating: Float!\n",
			[]string{"MarketplaceAsset.rating: type is Float!, want Float"}},
		{"output made nullable", "  organization: Organization!\n", "  organization: Organization\n",
			[]string{"Project.organization: type is Organization, want Organization!"}},
		{"list items made nullable", "  badges: [String!]!\n", "  badges: [String]!\n",
			[]string{"MarketplaceAsset.badges: type is [String]!, want [String!]!"}},
		{"list dropped", "  name: [JSON!]!\n", "  name: JSON!\n",
			[]string{"FHIRPatient.name: type is JSON!, want [JSON!]!"}},
		{"list nested", "): [Organization!]!", "): [[Organization!]!]!",
			[]string{"Query.organizations: type is [[Organization!]!]!, want [Organization!]!"}},
		{"root result made nullable", "deploymentStatusChanged(deploymentId: ID!): Deployment!", "deploymentStatusChanged(deploymentId: ID!): Deployment",
			[]string{"Subscription.deploymentStatusChanged: type is Deployment, want Deployment!"}},
		{"argument removed", "    \"Lower bound on rating.\"\n    minRating: Float\n", "",
			[]string{"Query.assets(minRating:): missing argument"}},
		{"argument made nullable", "organization(id: ID!): Organization", "organization(id: ID): Organization",
			[]string{"Query.organization(id:): type is ID, want ID!"}},
		{"argument list dropped", "to deliver; all when omitted.\"\n    types: [String!]\n", "to deliver; all when omitted.\"\n    types: String\n",
			[]string{"Subscription.eventStream(types:): type is String, want [String!]"}},
		{"argument renamed", "  createDeployment(\n    installationId: ID!\n", "  createDeployment(\n    deploymentInstallationId: ID!\n",
			[]string{"Mutation.createDeployment(installationId:): missing argument",
				"Mutation.createDeployment(deploymentInstallationId:): extra required argument of type ID! breaks existing clients"}},
		{"extension changed (not the spec's business)", "recoverWebhookDeliveries(webhookId: ID!", "recoverWebhookDeliveries(hookId: ID!", nil},
		{"extra required argument", "  agents(\n    projectId: ID!\n", "  agents(\n    projectId: ID!\n    tenantId: ID!\n",
			[]string{"Query.agents(tenantId:): extra required argument of type ID! breaks existing clients"}},
		{"enum value removed", "  CANCELLED\n", "",
			[]string{"enum RunStatus: missing value CANCELLED"}},
		{"enum renamed", "enum FHIRResourceType {", "enum FHIRResourceKind {",
			[]string{"enum FHIRResourceType: missing type"}},
		{"input field made nullable", "  supportEmail: String!\n", "  supportEmail: String\n",
			[]string{"SubmitAssetInput.supportEmail: type is String, want String!"}},
		{"extra required input field", "  supportEmail: String!\n", "  supportEmail: String!\n  region: String!\n",
			[]string{"SubmitAssetInput.region: extra required input field of type String! breaks existing clients"}},
		{"subscription field removed", "  \"\"\"\n  Pushes the deployment whenever its status changes.\n  \"\"\"\n  deploymentStatusChanged(deploymentId: ID!): Deployment!\n", "",
			[]string{"Subscription.deploymentStatusChanged: missing field"}},
		{"mutation root dropped", "  mutation: Mutation\n", "",
			[]string{"schema: no mutation root type"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Compare(spec, introspectSchema(t, replaceOnce(t, sdl, c.old, c.new)))
			if !slices.Equal(got, c.want) {
				t.Fatalf("Compare = %q, want %q", got, c.want)
			}
		})
	}
}

// TestCompareToleratesAdditions adds what a later change may add (a field, a nullable argument, a
// defaulted non-null argument, an enum value, a type, an optional input field) and expects no
// difference, with each addition listed by Extensions.
func TestCompareToleratesAdditions(t *testing.T) {
	spec := loadSpec(t)
	sdl := schemaSDL(t)
	for _, e := range []struct{ old, new string }{
		{"  slug: String!\n", "  slug: String!\n  domain: String\n"},
		{"  agents(\n    projectId: ID!\n", "  agents(\n    projectId: ID!\n    archived: Boolean\n    sort: String! = \"name\"\n"},
		{"  CANCELLED\n", "  CANCELLED\n  TIMED_OUT\n"},
		{"  supportEmail: String!\n", "  supportEmail: String!\n  region: String\n"},
		{"input SubmitAssetInput {", "type Extra {\n  x: Int\n}\n\ninput SubmitAssetInput {"},
	} {
		sdl = replaceOnce(t, sdl, e.old, e.new)
	}
	r := introspectSchema(t, sdl)
	if d := Compare(spec, r); len(d) != 0 {
		t.Fatalf("Compare = %q, want no differences", d)
	}
	var paths []string
	for _, e := range Extensions(spec, r) {
		paths = append(paths, e.Path)
	}
	for _, want := range []string{"Organization.domain", "Query.agents(archived:)", "Query.agents(sort:)",
		"enum RunStatus value TIMED_OUT", "SubmitAssetInput.region", "type Extra"} {
		if !slices.Contains(paths, want) {
			t.Errorf("Extensions lacks %s", want)
		}
	}
}
