package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// exportFigure is one download of GET /v1/events/export, measured end to end: the request
// through the api (authentication, scopes, the PHI guard of every chunk, the encoder, gzip) to
// the last byte the client read.
type exportFigure struct {
	Format        string  `json:"format"` // ndjson, csv, ndjson+gzip
	Events        int64   `json:"events"`
	Bytes         int64   `json:"bytes"` // as the client read them (decompressed)
	Seconds       float64 `json:"seconds"`
	EventsPerSec  float64 `json:"eventsPerSec"`
	MBytesPerSec  float64 `json:"mbytesPerSec"`
	FirstByteMs   float64 `json:"firstByteMs"`
	CompleteError string  `json:"error,omitempty"`
}

// measureExports downloads the run's events (its types in project) once per format and checks
// that each download holds want events.
func measureExports(ctx context.Context, hc *http.Client, base, key, project string, types []string, want int64) ([]exportFigure, error) {
	var out []exportFigure
	for _, f := range []struct{ name, format, gzip string }{
		{"ndjson", "ndjson", "false"}, {"csv", "csv", "false"}, {"ndjson+gzip", "ndjson", "true"},
	} {
		q := url.Values{"projectId": {project}, "types": {strings.Join(types, ",")}, "format": {f.format}, "gzip": {f.gzip}}
		fig, err := download(ctx, hc, base+"/v1/events/export?"+q.Encode(), key, f.format == "csv")
		fig.Format = f.name
		out = append(out, fig)
		if err != nil {
			return out, fmt.Errorf("export %s: %w", f.name, err)
		}
		if fig.Events != want {
			return out, fmt.Errorf("export %s: %d events, want the %d published", f.name, fig.Events, want)
		}
	}
	return out, nil
}

// download reads one export to its end, counting its records (lines; the header row of a CSV
// aside) and bytes. The transport asks for gzip and decompresses what comes so; a download cut by
// an error ends with an {"error": …} line (NDJSON), which is reported.
func download(ctx context.Context, hc *http.Client, u, key string, header bool) (exportFigure, error) {
	var fig exportFigure
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fig, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	began := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return fig, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fig, fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	br := bufio.NewReaderSize(resp.Body, 256<<10)
	var last []byte // the last line, kept only when it is an error line (the stream's end)
	for {
		line, err := br.ReadSlice('\n')
		if fig.Bytes == 0 && len(line) > 0 {
			fig.FirstByteMs = float64(time.Since(began).Microseconds()) / 1000
		}
		fig.Bytes += int64(len(line))
		if len(line) > 0 && line[len(line)-1] == '\n' {
			fig.Events++
			last = last[:0]
			if bytes.HasPrefix(line, []byte(`{"error":`)) {
				last = append(last, line...)
			}
		}
		if err == bufio.ErrBufferFull {
			continue // a line longer than the buffer: counted at its end
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return fig, err
		}
	}
	elapsed := time.Since(began)
	if header && fig.Events > 0 {
		fig.Events--
	}
	if bytes.HasPrefix(last, []byte(`{"error":`)) {
		fig.Events--
		fig.CompleteError = string(bytes.TrimSpace(last))
	}
	fig.Seconds = elapsed.Seconds()
	fig.EventsPerSec = float64(fig.Events) / elapsed.Seconds()
	fig.MBytesPerSec = float64(fig.Bytes) / elapsed.Seconds() / 1e6
	if fig.CompleteError != "" {
		return fig, fmt.Errorf("the download ended with %s", fig.CompleteError)
	}
	return fig, nil
}
