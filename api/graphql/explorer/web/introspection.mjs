// Writes the stand-in schema's introspection result that TestExplorerEndToEnd
// serves (../testdata/introspection.json) to stdout. Regenerate with
//   node introspection.mjs > ../testdata/introspection.json
// TestIntrospectionDrift fails when the committed file differs from this output.
import { buildSchema, introspectionFromSchema } from 'graphql';

const schema = buildSchema(`"Stand-in schema for explorer_e2e_test.go."
type Query { organizations: [Organization!]! }
type Organization { id: ID! name: String! slug: String! plan: String! }`);
process.stdout.write(JSON.stringify({ data: introspectionFromSchema(schema) }) + '\n');
