package server_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/internal/testenv"
	"carehub/storage/demo"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestExplorerAgainstServer opens the real server's /graphiql in headless Chromium, pastes a key,
// runs the default organizations query and expects the demo organization in the response pane.
func TestExplorerAgainstServer(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped with -short")
	}
	web, _ := filepath.Abs("../graphql/explorer/web")
	for _, need := range []string{"/usr/bin/chromium", filepath.Join(web, "node_modules", "playwright-core")} {
		if _, err := os.Stat(need); err != nil {
			testenv.Missing(t, "explorer end-to-end test needs %s (make test installs it: make test-deps)", need)
		}
	}
	if _, err := exec.LookPath("node"); err != nil {
		testenv.Missing(t, "explorer end-to-end test needs node (apt-get install nodejs)")
	}
	s := servertest.Start(t)
	shot := filepath.Join(t.TempDir(), "explorer.png")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "e2e.mjs")
	cmd.Dir = web
	cmd.Env = append(os.Environ(), "BASE_URL="+s.URL, "API_KEY="+s.DemoKey(), "EXPECT="+demo.DemoOrgSlug, "SCREENSHOT="+shot)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("explorer end-to-end against the server failed: %v\n%s", err, out)
	}
	if fi, err := os.Stat(shot); err != nil || fi.Size() == 0 {
		t.Fatalf("no screenshot taken: %v", err)
	}
	if dir := os.Getenv("EXPLORER_E2E_SCREENSHOT_DIR"); dir != "" {
		b, _ := os.ReadFile(shot)
		os.WriteFile(filepath.Join(dir, "explorer-server.png"), b, 0o644)
	}
}
