package explorer

import (
	"bytes"
	"compress/gzip"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const wantCSP = "default-src 'self'; connect-src 'self' ws: wss:; script-src 'self'; " +
	"style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; " +
	"object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// newServer mounts the explorer the way the API server does.
func newServer(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	h := Handler()
	mux.Handle("GET /graphiql", h)
	mux.Handle("GET /graphiql/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func embedded(t *testing.T, name string) []byte {
	t.Helper()
	b, err := fs.ReadFile(dist, "dist/"+name)
	if err != nil {
		t.Fatalf("read embedded %s: %v", name, err)
	}
	return b
}

func TestHandlerServesPageAndAssets(t *testing.T) {
	srv := newServer(t)
	bundle, err := loadBundle()
	if err != nil {
		t.Fatal(err)
	}
	jsVersion, cssVersion := bundle["app.js"].version, bundle["app.css"].version

	tests := []struct {
		name         string
		path         string
		wantType     string
		wantFile     string
		wantCache    string
		wantContains string
	}{
		{"mount path", "/graphiql", "text/html; charset=utf-8", "index.html", "no-cache", "<title>carehub GraphQL explorer (API 2.0)</title>"},
		{"mount path with slash", "/graphiql/", "text/html; charset=utf-8", "index.html", "no-cache", `<div id="root"></div>`},
		{"index by name", "/graphiql/index.html", "text/html; charset=utf-8", "index.html", "no-cache", "/graphiql/app.js?v=" + jsVersion},
		{"script", "/graphiql/app.js", "text/javascript; charset=utf-8", "app.js", "no-cache", "API key"},
		{"script at its version", "/graphiql/app.js?v=" + jsVersion, "text/javascript; charset=utf-8", "app.js", "public, max-age=31536000, immutable", "organizations"},
		{"script at a stale version", "/graphiql/app.js?v=0123456789abcdef", "text/javascript; charset=utf-8", "app.js", "no-cache", ""},
		{"stylesheet", "/graphiql/app.css", "text/css; charset=utf-8", "app.css", "no-cache", ".graphiql-container"},
		{"stylesheet at its version", "/graphiql/app.css?v=" + cssVersion, "text/css; charset=utf-8", "app.css", "public, max-age=31536000, immutable", ".ch-bar"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := http.Get(srv.URL + tt.path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status = %d, want 200; body %q", resp.StatusCode, body)
			}
			checkHeader(t, resp, "Content-Type", tt.wantType)
			checkHeader(t, resp, "Cache-Control", tt.wantCache)
			checkHeader(t, resp, "Content-Security-Policy", wantCSP)
			checkHeader(t, resp, "X-Content-Type-Options", "nosniff")
			checkHeader(t, resp, "X-Frame-Options", "DENY")
			if resp.Header.Get("ETag") == "" {
				t.Error("no ETag")
			}
			// The Go client asks for gzip and undoes it itself.
			if !bytes.Equal(body, embedded(t, tt.wantFile)) {
				t.Errorf("body is not dist/%s (%d bytes, want %d)", tt.wantFile, len(body), len(embedded(t, tt.wantFile)))
			}
			if !strings.Contains(string(body), tt.wantContains) {
				t.Errorf("body does not contain %q", tt.wantContains)
			}
		})
	}
}

func TestHandlerRejects(t *testing.T) {
	h := Handler()
	tests := []struct {
		name       string
		method     string
		path       string
		wantStatus int
	}{
		{"unknown asset", http.MethodGet, "/graphiql/app.js.map", http.StatusNotFound},
		{"unknown file", http.MethodGet, "/graphiql/logo.png", http.StatusNotFound},
		{"post", http.MethodPost, "/graphiql", http.StatusMethodNotAllowed},
		{"delete", http.MethodDelete, "/graphiql/app.js", http.StatusMethodNotAllowed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, nil))
			if rec.Code != tt.wantStatus {
				t.Fatalf("status = %d, want %d", rec.Code, tt.wantStatus)
			}
			if got := rec.Header().Get("Content-Security-Policy"); got != wantCSP {
				t.Errorf("error response CSP = %q", got)
			}
			if tt.wantStatus == http.StatusMethodNotAllowed && rec.Header().Get("Allow") != "GET, HEAD" {
				t.Errorf("Allow = %q", rec.Header().Get("Allow"))
			}
			if strings.Contains(rec.Body.String(), "<html") {
				t.Error("error response is the page")
			}
		})
	}
}

func TestHandlerHeadAndConditional(t *testing.T) {
	h := Handler()
	js := embedded(t, "app.js")

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodHead, "/graphiql/app.js", nil))
	if rec.Code != http.StatusOK || rec.Body.Len() != 0 {
		t.Fatalf("HEAD: status %d, %d body bytes", rec.Code, rec.Body.Len())
	}
	if got, want := rec.Header().Get("Content-Length"), strconv.Itoa(len(js)); got != want {
		t.Errorf("HEAD Content-Length = %s, want %s", got, want)
	}

	etag := rec.Header().Get("ETag")
	req := httptest.NewRequest(http.MethodGet, "/graphiql/app.js", nil)
	req.Header.Set("If-None-Match", etag)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusNotModified {
		t.Errorf("If-None-Match %s: status %d, want 304", etag, rec.Code)
	}

	req = httptest.NewRequest(http.MethodGet, "/graphiql/app.js", nil)
	req.Header.Set("If-None-Match", `"stale"`)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Errorf("stale If-None-Match: status %d, want 200", rec.Code)
	}
}

func TestHandlerGzip(t *testing.T) {
	h := Handler()
	tests := []struct {
		acceptEncoding string
		wantGzip       bool
	}{
		{"", false},
		{"gzip", true},
		{"br, gzip;q=0.5", true},
		{"GZIP", true},
		{"gzip;q=0", false},
		{"gzip; q=0.000", false},
		{"*", true},
		{"*;q=0", false},
		{"gzip;q=0, *", false},
		{"identity", false},
		{"br", false},
	}
	for _, tt := range tests {
		t.Run(tt.acceptEncoding, func(t *testing.T) {
			if got := acceptsGzip(tt.acceptEncoding); got != tt.wantGzip {
				t.Fatalf("acceptsGzip(%q) = %v, want %v", tt.acceptEncoding, got, tt.wantGzip)
			}
			for _, name := range []string{"app.js", "app.css"} {
				req := httptest.NewRequest(http.MethodGet, "/graphiql/"+name, nil)
				req.Header.Set("Accept-Encoding", tt.acceptEncoding)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if !slices.Contains(rec.Header().Values("Vary"), "Accept-Encoding") {
					t.Errorf("%s: Vary = %q", name, rec.Header().Values("Vary"))
				}
				body := rec.Body.Bytes()
				gotGzip := rec.Header().Get("Content-Encoding") == "gzip"
				if gotGzip != tt.wantGzip {
					t.Fatalf("%s: Content-Encoding = %q, want gzip %v", name, rec.Header().Get("Content-Encoding"), tt.wantGzip)
				}
				if gotGzip {
					zr, err := gzip.NewReader(bytes.NewReader(body))
					if err != nil {
						t.Fatal(err)
					}
					if body, err = io.ReadAll(zr); err != nil {
						t.Fatal(err)
					}
					if rec.Header().Get("ETag") == Handler().(handler).bundle[name].etag {
						t.Errorf("%s: gzip representation shares the identity ETag", name)
					}
				}
				if !bytes.Equal(body, embedded(t, name)) {
					t.Errorf("%s: decoded body differs from dist", name)
				}
			}
		})
	}
}

// TestBundleIsSelfContained guards the committed dist/: exactly the three
// files, the page loads only versioned same-origin assets, and the
// stylesheet pulls nothing from elsewhere (fonts stay data: URLs).
func TestBundleIsSelfContained(t *testing.T) {
	entries, err := fs.ReadDir(dist, "dist")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"app.css", "app.js", "index.html"}; !slices.Equal(names, want) {
		t.Errorf("dist holds %v, want %v", names, want)
	}

	bundle, err := loadBundle()
	if err != nil {
		t.Fatal(err)
	}
	page := string(embedded(t, "index.html"))
	refs := regexp.MustCompile(`(?:src|href)="([^"]*)"`).FindAllStringSubmatch(page, -1)
	want := []string{
		"/graphiql/app.css?v=" + bundle["app.css"].version,
		"/graphiql/app.js?v=" + bundle["app.js"].version,
	}
	var got []string
	for _, m := range refs {
		got = append(got, m[1])
	}
	// A mismatch means dist/ was edited by hand or build.mjs and this
	// package disagree on how versions are computed.
	if !slices.Equal(got, want) {
		t.Errorf("index.html references %q, want %q", got, want)
	}
	if strings.Contains(page, "<script>") || strings.Contains(page, "<style") {
		t.Error("index.html has inline script or style, which the CSP forbids or should not need")
	}

	css := string(embedded(t, "app.css"))
	for _, m := range regexp.MustCompile(`url\(\s*['"]?([^'")]*)`).FindAllStringSubmatch(css, -1) {
		if !strings.HasPrefix(m[1], "data:") {
			t.Errorf("app.css loads %q", m[1])
		}
	}
	if strings.Contains(css, "@import") {
		t.Error("app.css has @import")
	}
	for _, name := range []string{"app.js", "app.css"} {
		if bytes.Contains(embedded(t, name), []byte("sourceMappingURL")) {
			t.Errorf("%s references a source map", name)
		}
	}
}

func TestResolve(t *testing.T) {
	h := Handler().(handler)
	tests := []struct {
		path   string
		want   string
		wantOK bool
	}{
		{"/graphiql", "index.html", true},
		{"/graphiql/", "index.html", true},
		{"/graphiql/index.html", "index.html", true},
		{"/graphiql/app.js", "app.js", true},
		{"/graphiql/app.css", "app.css", true},
		{"/explore", "index.html", true},
		{"/graphiql/app.js.map", "", false},
		{"/graphiql/favicon.ico", "", false},
	}
	for _, tt := range tests {
		got, ok := h.resolve(tt.path)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("resolve(%q) = %q, %v; want %q, %v", tt.path, got, ok, tt.want, tt.wantOK)
		}
	}
}

func checkHeader(t *testing.T, resp *http.Response, key, want string) {
	t.Helper()
	if got := resp.Header.Get(key); got != want {
		t.Errorf("%s = %q, want %q", key, got, want)
	}
}
