package explorer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"carehub/internal/testenv"
)

const (
	e2eKey        = "chk_test_e2e"
	e2eChromium   = "/usr/bin/chromium"
	e2eWebDir     = "web"
	organizations = `{"data":{"organizations":[{"id":"org_1","name":"Demo","slug":"demo-health","plan":"growth"}]}}`
)

// standIn is the /graphql endpoint of TestExplorerEndToEnd: it answers only
// requests with the right key and records what it was sent.
type standIn struct {
	introspection []byte

	mu            sync.Mutex
	queries       int // authorized requests other than introspection
	unauthorized  int
	authorization []string
}

func (s *standIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Query         string `json:"query"`
		OperationName string `json:"operationName"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")

	s.mu.Lock()
	defer s.mu.Unlock()
	s.authorization = append(s.authorization, r.Header.Get("Authorization"))
	if r.Header.Get("Authorization") != "Bearer "+e2eKey {
		s.unauthorized++
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"errors":[{"message":"unauthenticated: missing or invalid API key","extensions":{"code":"UNAUTHENTICATED"}}]}`))
		return
	}
	if req.OperationName == "IntrospectionQuery" {
		_, _ = w.Write(s.introspection)
		return
	}
	s.queries++
	_, _ = w.Write([]byte(organizations))
}

// TestExplorerEndToEnd runs web/e2e.mjs (headless Chromium) against Handler
// and a stand-in /graphql that answers only with the right key. The same
// script runs against the real server elsewhere; here it also must fail when
// the key is wrong, so a script that always exits 0 cannot pass.
//
// testdata/introspection.json is the stand-in's schema, generated in web/ with
// graphql-js: buildSchema of "type Query { organizations: [Organization!]! }
// type Organization { id: ID! name: String! slug: String! plan: String! }"
// passed to introspectionFromSchema, wrapped in {"data": ...}.
func TestExplorerEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end browser test skipped in -short mode")
	}
	if _, err := os.Stat(e2eChromium); err != nil {
		testenv.Missing(t, "end-to-end test needs Debian's chromium at %s (make test-deps): %v", e2eChromium, err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Missing(t, "end-to-end test needs node on PATH: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e2eWebDir, "node_modules", "playwright-core")); err != nil {
		testenv.Missing(t, "end-to-end test needs web/node_modules (make node-deps): %v", err)
	}
	introspection, err := os.ReadFile(filepath.Join("testdata", "introspection.json"))
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name     string
		key      string
		timeout  time.Duration // e2e.mjs's own wait for the response
		wantPass bool
	}{
		{"key as issued", e2eKey, 30 * time.Second, true},
		{"key pasted with its scheme", "Bearer " + e2eKey, 30 * time.Second, true},
		{"wrong key", "chk_wrong", 5 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := &standIn{introspection: introspection}
			mux := http.NewServeMux()
			mux.Handle("GET /graphiql", Handler())
			mux.Handle("GET /graphiql/", Handler())
			mux.Handle("POST /graphql", api)
			srv := httptest.NewServer(mux)
			defer srv.Close()

			shot := os.Getenv("EXPLORER_E2E_SCREENSHOT_DIR")
			if shot == "" {
				shot = t.TempDir()
			}
			shot = filepath.Join(shot, strings.ReplaceAll(tt.name, " ", "_")+".png")

			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, "e2e.mjs")
			cmd.Dir = e2eWebDir
			cmd.Env = append(os.Environ(),
				"BASE_URL="+srv.URL,
				"API_KEY="+tt.key,
				"EXPECT=demo-health",
				"SCREENSHOT="+shot,
				"TIMEOUT_MS="+strconv.FormatInt(tt.timeout.Milliseconds(), 10),
			)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			runErr := cmd.Run()
			t.Logf("e2e.mjs output:\n%s", out.String())

			api.mu.Lock()
			queries, unauthorized, sent := api.queries, api.unauthorized, api.authorization
			api.mu.Unlock()

			if tt.wantPass {
				if runErr != nil {
					t.Fatalf("e2e.mjs failed: %v", runErr)
				}
				if queries == 0 {
					t.Error("stand-in answered no authorized query, yet e2e.mjs passed")
				}
			} else {
				var exit *exec.ExitError
				if runErr == nil {
					t.Fatal("e2e.mjs passed with a wrong key")
				}
				if !errors.As(runErr, &exit) || exit.ExitCode() != 1 {
					t.Fatalf("e2e.mjs: %v, want exit status 1", runErr)
				}
				if queries != 0 {
					t.Errorf("stand-in answered %d queries for a wrong key", queries)
				}
				if unauthorized == 0 {
					t.Error("stand-in saw no request from the page")
				}
			}
			for _, a := range sent {
				if strings.Count(a, "Bearer") > 1 {
					t.Errorf("Authorization sent as %q", a)
				}
			}
			if png, err := os.ReadFile(shot); err != nil {
				t.Errorf("no screenshot: %v", err)
			} else if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 10_000 {
				t.Errorf("screenshot %s is not a plausible PNG (%d bytes)", shot, len(png))
			}
		})
	}
}
