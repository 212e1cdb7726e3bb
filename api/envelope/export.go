package envelope

import (
	"encoding/csv"
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"github.com/klauspost/compress/gzip"
)

// Export formats.
const (
	FormatNDJSON = "ndjson"
	FormatCSV    = "csv"
)

// ExportOptions reads the download parameters every export route takes: format (ndjson, the
// default, or csv) and gzip (true or false; without it, gzip when Accept-Encoding offers it).
func ExportOptions(q *Query, r *http.Request) (format string, compress bool) {
	format = q.Enum("format", FormatNDJSON, FormatCSV)
	if format == "" {
		format = FormatNDJSON
	}
	switch q.Enum("gzip", "true", "false") {
	case "true":
		compress = true
	case "":
		compress = acceptsGzip(r.Header.Get("Accept-Encoding"))
	}
	return format, compress
}

func acceptsGzip(header string) bool {
	for part := range strings.SplitSeq(header, ",") {
		coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(coding), "gzip") && strings.ReplaceAll(strings.TrimSpace(params), " ", "") != "q=0" {
			return true
		}
	}
	return false
}

// Export is a streamed download of records, one NDJSON line or CSV row each, written as they
// come and flushed every flushEvery records: it holds one record at a time, whatever the size.
// Once started the status is 200: an error afterwards ends the body early (NDJSON: with a last
// line {"error": …}); every record carries the cursor that resumes after it.
type Export struct {
	w       io.Writer
	gz      *gzip.Writer
	csv     *csv.Writer
	enc     *json.Encoder
	flusher http.Flusher
	n       int
	line    []byte // a LineAppender's line, reused
}

const flushEvery = 1000

// StartExport writes the headers of a download named filename (without extension) in format,
// gzip-compressed if compress; columns are the CSV header row.
func StartExport(w http.ResponseWriter, filename, format string, compress bool, columns []string) *Export {
	e := &Export{w: w}
	e.flusher, _ = w.(http.Flusher)
	h := w.Header()
	ext := ".ndjson"
	h.Set("Content-Type", "application/x-ndjson")
	if format == FormatCSV {
		ext = ".csv"
		h.Set("Content-Type", "text/csv; charset=utf-8")
	}
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if compress {
		h.Set("Content-Encoding", "gzip")
		h.Add("Vary", "Accept-Encoding")
		// klauspost/compress's fastest level: 4× the standard library's default level on
		// export lines, the output 5 % larger (compression, not the store, bounded a gzipped
		// export at half the rate of a plain one).
		e.gz, _ = gzip.NewWriterLevel(w, gzip.BestSpeed)
		e.w = e.gz
	}
	h.Set("Content-Disposition", `attachment; filename="`+filename+ext+`"`)
	w.WriteHeader(http.StatusOK)
	if format == FormatCSV {
		e.csv = csv.NewWriter(e.w)
		_ = e.csv.Write(columns)
	} else {
		e.enc = json.NewEncoder(e.w)
	}
	return e
}

// LineAppender is a record that writes its own NDJSON line: the JSON json.Marshal would write
// of it (up to HTML escaping), without reflection. Export.Write takes it for the hot exports.
type LineAppender interface {
	AppendJSON(b []byte) ([]byte, error)
}

// Write writes one record: v as an NDJSON line, or row as a CSV row.
func (e *Export) Write(v any, row []string) error {
	var err error
	switch la, ok := v.(LineAppender); {
	case e.csv != nil:
		err = e.csv.Write(row)
	case ok:
		if e.line, err = la.AppendJSON(e.line[:0]); err == nil {
			_, err = e.w.Write(append(e.line, '\n'))
		}
	default:
		err = e.enc.Encode(v)
	}
	if err != nil {
		return err
	}
	if e.n++; e.n%flushEvery == 0 {
		e.flush()
	}
	return nil
}

func (e *Export) flush() {
	if e.csv != nil {
		e.csv.Flush()
	}
	if e.gz != nil {
		_ = e.gz.Flush()
	}
	if e.flusher != nil {
		e.flusher.Flush()
	}
}

// Close ends the download. A non-nil err (the export stopped early) is written as a last
// NDJSON line {"error": {code, message}} so a client can tell a cut download from a complete one;
// a CSV download just ends.
func (e *Export) Close(err error) {
	if err != nil && e.enc != nil {
		_, code := Status(err)
		msg := "the export stopped early: resume from the cursor of the last record"
		_ = e.enc.Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
	}
	if e.csv != nil {
		e.csv.Flush()
	}
	if e.gz != nil {
		_ = e.gz.Close()
	}
}
