package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"carehub/e2e/servertest"
)

type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// requests returns the levels of the access-log lines written so far.
func (l *logLines) requests(t *testing.T) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var levels []string
	dec := json.NewDecoder(bytes.NewReader(l.buf.Bytes()))
	for dec.More() {
		var line struct{ Level, Msg string }
		if err := dec.Decode(&line); err != nil {
			t.Fatal(err)
		}
		if line.Msg == "request" {
			levels = append(levels, line.Level)
		}
	}
	return levels
}

// --access-log sets the level of the per-request line or turns it off, and
// --access-log-sample logs that fraction of the requests, counted exactly.
func TestAccessLogLevelAndSampling(t *testing.T) {
	for _, tc := range []struct {
		name      string
		accessLog string
		sample    float64
		logLevel  slog.Level
		want      int
		wantLevel string
	}{
		{"default: every request at INFO", "info", 1, slog.LevelInfo, 8, "INFO"},
		{"debug, sampled by half", "debug", 0.5, slog.LevelDebug, 4, "DEBUG"},
		{"debug lines under an info logger", "debug", 1, slog.LevelInfo, 0, ""},
		{"off", "off", 1, slog.LevelDebug, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := servertest.Config(t, servertest.WithoutSeed())
			cfg.AccessLog, cfg.AccessLogSample = tc.accessLog, tc.sample
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			var lines logLines
			s := servertest.StartLogged(t, cfg, slog.New(slog.NewJSONHandler(&lines, &slog.HandlerOptions{Level: tc.logLevel})))
			for range 8 {
				if r := s.Do(http.MethodGet, "/v1/event-types", "", nil); r.Status != http.StatusOK {
					t.Fatalf("HTTP %d", r.Status)
				}
			}
			// An access line is written after its answer; a closed node has drained every handler.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
			got := lines.requests(t)
			if len(got) != tc.want {
				t.Fatalf("%d access lines, want %d", len(got), tc.want)
			}
			for _, l := range got {
				if l != tc.wantLevel {
					t.Errorf("access line at %s, want %s", l, tc.wantLevel)
				}
			}
		})
	}
}
