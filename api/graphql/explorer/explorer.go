// Package explorer serves the interactive GraphQL explorer: GraphiQL with an
// API key field, bundled into the binary so the page needs no CDN at run time.
//
// The bundle in dist/ is generated from web/ and committed; regenerate it with
//
//	cd api/graphql/explorer/web && npm ci && npm run build
//
// TestBundleDrift (run by make lint) rebuilds it and fails when the committed
// files differ. The page talks to
// the same origin only: POST /graphql for queries and mutations, and a
// WebSocket on /graphql (graphql-transport-ws) for subscriptions. The key the
// user pastes is sent as "Authorization: Bearer <key>" and as the
// Authorization connection parameter, and kept in the tab's sessionStorage.
package explorer

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The build (web/build.mjs) writes exactly these files.
//
//go:embed dist
var dist embed.FS

// ContentSecurityPolicy is sent with every response of the explorer. Scripts
// and styles come only from the binary; GraphiQL sets inline styles, hence
// 'unsafe-inline' for styles (never for scripts). connect-src allows ws: and
// wss: because the subscription socket is opened by URL.
const ContentSecurityPolicy = "default-src 'self'; " +
	"connect-src 'self' ws: wss:; " +
	"script-src 'self'; " +
	"style-src 'self' 'unsafe-inline'; " +
	"img-src 'self' data:; " +
	"font-src 'self' data:; " +
	"object-src 'none'; " +
	"base-uri 'none'; " +
	"form-action 'none'; " +
	"frame-ancestors 'none'"

const (
	indexName = "index.html"
	// cacheForever is used only when the request names the asset's current
	// version (?v=, written into index.html by the build), so a new binary
	// can never be served a stale asset from a cache.
	cacheForever = "public, max-age=31536000, immutable"
	// cacheRevalidate makes browsers ask every time; the ETag turns that into
	// a 304 while the binary is unchanged.
	cacheRevalidate = "no-cache"
)

var contentTypes = map[string]string{
	indexName: "text/html; charset=utf-8",
	"app.js":  "text/javascript; charset=utf-8",
	"app.css": "text/css; charset=utf-8",
}

type asset struct {
	body        []byte
	gzipped     []byte // nil when compression does not pay
	contentType string
	etag        string
	version     string // first 16 hex digits of the body's SHA-256, as build.mjs computes
}

// loadBundle reads and prepares the embedded files once per process, however
// many times Handler is called.
var loadBundle = sync.OnceValues(func() (map[string]*asset, error) {
	return readBundle(dist)
})

func readBundle(fsys fs.FS) (map[string]*asset, error) {
	bundle := make(map[string]*asset, len(contentTypes))
	for name, ctype := range contentTypes {
		body, err := fs.ReadFile(fsys, "dist/"+name)
		if err != nil {
			return nil, fmt.Errorf("read explorer bundle: %w", err)
		}
		sum := sha256.Sum256(body)
		a := &asset{
			body:        body,
			contentType: ctype,
			etag:        `"` + hex.EncodeToString(sum[:16]) + `"`,
			version:     hex.EncodeToString(sum[:8]),
		}
		if a.gzipped, err = compress(body); err != nil {
			return nil, fmt.Errorf("compress %s: %w", name, err)
		}
		bundle[name] = a
	}
	return bundle, nil
}

// compress returns body gzipped, or nil when that would not save at least a
// tenth of it (tiny files).
func compress(body []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(body); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	if buf.Len() > len(body)*9/10 {
		return nil, nil
	}
	return buf.Bytes(), nil
}

// Handler returns the explorer's HTTP handler. It is meant to be mounted at a
// path and the subtree below it (the server uses GET /graphiql and
// /graphiql/), and it works on the last element of the request path:
//
//   - "app.js" and "app.css" are the bundle's assets;
//   - a path ending in "/", "index.html" or a last element without a dot
//     (the mount path itself, such as /graphiql) gets the page;
//   - anything else is 404.
//
// The page references its assets under /graphiql/, so mounting it elsewhere
// needs a rebuild with another base in web/build.mjs.
//
// Only GET and HEAD are allowed. Every response carries
// ContentSecurityPolicy and nosniff; assets are gzipped for clients that
// accept it and answer conditional requests with 304. Handler is safe for
// concurrent use. It panics if the embedded bundle is incomplete, which only
// a broken build can cause and the package's tests rule out.
func Handler() http.Handler {
	bundle, err := loadBundle()
	if err != nil {
		panic(err)
	}
	return handler{bundle: bundle}
}

type handler struct {
	bundle map[string]*asset
}

func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", ContentSecurityPolicy)
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Referrer-Policy", "no-referrer")

	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}

	name, ok := h.resolve(r.URL.Path)
	if !ok {
		http.NotFound(w, r)
		return
	}
	a := h.bundle[name]

	body, etag := a.body, a.etag
	hdr.Set("Content-Type", a.contentType)
	if name == indexName {
		hdr.Set("Cache-Control", cacheRevalidate)
	} else {
		if r.URL.Query().Get("v") == a.version {
			hdr.Set("Cache-Control", cacheForever)
		} else {
			hdr.Set("Cache-Control", cacheRevalidate)
		}
		hdr.Add("Vary", "Accept-Encoding")
		if a.gzipped != nil && acceptsGzip(r.Header.Get("Accept-Encoding")) {
			hdr.Set("Content-Encoding", "gzip")
			body = a.gzipped
			// Each representation needs its own strong validator.
			etag = strings.TrimSuffix(a.etag, `"`) + `-gz"`
		}
	}
	hdr.Set("ETag", etag)
	// A zero modtime leaves Last-Modified out; the ETag does the revalidation.
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(body))
}

// resolve maps a request path to a bundle file, see Handler.
func (h handler) resolve(path string) (string, bool) {
	last := path[strings.LastIndexByte(path, '/')+1:]
	switch {
	case last == "" || last == indexName:
		return indexName, true
	case h.bundle[last] != nil:
		return last, true
	case !strings.Contains(last, "."):
		return indexName, true
	default:
		return "", false
	}
}

// acceptsGzip reports whether an Accept-Encoding value allows gzip: listed
// with a nonzero quality, or not listed and allowed through "*".
func acceptsGzip(header string) bool {
	gzipQ, starQ := -1.0, -1.0
	for _, part := range strings.Split(header, ",") {
		coding, params, _ := strings.Cut(part, ";")
		q := 1.0
		for _, p := range strings.Split(params, ";") {
			k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
			if strings.EqualFold(strings.TrimSpace(k), "q") {
				if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
					q = f
				}
			}
		}
		switch strings.ToLower(strings.TrimSpace(coding)) {
		case "gzip", "x-gzip":
			gzipQ = max(gzipQ, q)
		case "*":
			starQ = max(starQ, q)
		}
	}
	if gzipQ >= 0 {
		return gzipQ > 0
	}
	return starQ > 0
}
