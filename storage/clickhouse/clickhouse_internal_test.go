package clickhouse

import (
	"io/fs"
	"strings"
	"testing"

	"carehub/schemas"
)

// TestStatements checks the DDL splitter on the embedded files: the only part of Open that runs
// without a server.
func TestStatements(t *testing.T) {
	data, err := fs.ReadFile(schemas.ClickHouse, "clickhouse/0001_eventlog.sql")
	if err != nil {
		t.Fatal(err)
	}
	stmts := statements(string(data))
	if len(stmts) != 2 {
		t.Fatalf("%d statements, want 2: %q", len(stmts), stmts)
	}
	for i, want := range []string{"CREATE TABLE IF NOT EXISTS event_log", "CREATE TABLE IF NOT EXISTS audit_log"} {
		if !strings.HasPrefix(stmts[i], want) || strings.HasSuffix(stmts[i], ";") || strings.Contains(stmts[i], "--") {
			t.Errorf("statement %d = %q", i, stmts[i])
		}
	}
	if got := statements("-- c\nSELECT 1;\n\nSELECT 2"); len(got) != 2 || got[0] != "SELECT 1" || got[1] != "SELECT 2" {
		t.Errorf("statements = %q", got)
	}
}
