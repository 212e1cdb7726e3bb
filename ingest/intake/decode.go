package intake

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"carehub/kernel/fault"
	"carehub/kernel/jsonwire"
)

// chunkSize is how many NDJSON lines are validated, looked up and produced together.
const chunkSize = 500

// Media types accepted by POST /v1/observations.
const (
	MediaFHIRJSON   = "application/fhir+json"
	MediaJSON       = "application/json"
	MediaFHIRNDJSON = "application/fhir+ndjson"
	MediaNDJSON     = "application/x-ndjson"
)

// mediaKind maps Content-Type to the body format.
func mediaKind(contentType string) (media string, ndjson bool, err error) {
	mt, _, perr := mime.ParseMediaType(contentType)
	switch {
	case perr != nil && contentType != "":
	case mt == MediaFHIRJSON || mt == MediaJSON:
		return mt, false, nil
	case mt == MediaFHIRNDJSON || mt == MediaNDJSON || mt == "application/ndjson":
		return mt, true, nil
	}
	return "", false, fault.New(fault.KindUnsupportedMedia,
		"Content-Type must be %s or %s (an Observation or a Bundle) or %s (one Observation per line)", MediaFHIRJSON, MediaJSON, MediaFHIRNDJSON)
}

// limitReader fails with a 413 fault once more than left bytes are read.
type limitReader struct {
	r    io.Reader
	left int64
	max  int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.max == 0 {
		l.max = l.left
	}
	if l.left < 0 {
		return 0, errBodyTooLarge(l.max)
	}
	if int64(len(p)) > l.left+1 {
		p = p[:l.left+1]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if l.left < 0 {
		return n, errBodyTooLarge(l.max)
	}
	return n, err
}

func errBodyTooLarge(limit int64) error {
	return &fault.Error{Kind: fault.KindTooLarge, Message: fmt.Sprintf("the body exceeds %d bytes; nothing was accepted", limit),
		Details: map[string]any{"maxBytes": limit}}
}

// readError classifies a failure to read the body: too large (413), or a broken or timed out
// upload (400; the client will hardly see it).
func readError(err error) error {
	if fault.KindOf(err) == fault.KindTooLarge {
		return err
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return errBodyTooLarge(mbe.Limit)
	}
	return fault.Wrap(fault.KindInvalid, err, "the request body could not be read")
}

// entry is one observation of a request before validation; err is set when the envelope
// around it (a bundle entry) is already wrong.
type entry struct {
	index int
	raw   []byte
	err   *EntryError
}

// json handles a single Observation or a Bundle: the body is one JSON document (at most
// MaxBodyBytes), read whole, validated whole, and produced in one transaction.
func (rq *request) json(body io.Reader) (format string, accepted []string, err error) {
	data, err := io.ReadAll(body)
	if err != nil {
		return "unknown", nil, readError(err)
	}
	head, err := readDocument(data, rq.in.cfg.MaxEntries)
	if err != nil {
		return "unknown", nil, err
	}
	var entries []entry
	transaction := false
	switch head.resourceType {
	case "Observation":
		format = "observation"
		entries = []entry{{index: 0, raw: data}}
	case "Bundle":
		switch head.bundleType {
		case "batch", "collection": // a collection is what devices and exports send: taken like a batch
			format = "batch"
		case "transaction":
			format, transaction = "transaction", true
		default:
			return "bundle", nil, fault.Validation("Bundle.type must be batch, transaction or collection",
				map[string]string{"type": "must be batch, transaction or collection"})
		}
		if head.tooMany {
			return format, nil, tooManyEntries(rq.in.cfg.MaxEntries)
		}
		entries = head.entries
	default:
		rq.entries = 1
		rq.reject(0, entryErr(CodeInvalidResource, "resourceType must be Observation or Bundle, not %q", truncate(head.resourceType)))
		return "unknown", nil, nil
	}
	rq.entries = len(entries)
	recs, ids, err := rq.validate(entries)
	if err != nil {
		return format, nil, err
	}
	if transaction && len(rq.rejected) > 0 {
		return format, nil, rq.invalid(fmt.Sprintf("transaction bundle rejected: %d of %d entries are invalid; nothing was accepted",
			len(rq.rejected), len(entries)))
	}
	if len(recs) == 0 {
		return format, nil, nil
	}
	if err := rq.produce(recs); err != nil {
		return format, nil, err
	}
	if err := rq.commit(); err != nil {
		return format, nil, err
	}
	return format, ids, nil
}

// document is the top level of a JSON body: its resourceType, and for a Bundle its type and
// entries.
type document struct {
	resourceType string
	bundleType   string
	entries      []entry // of an "entry" array, whatever the resourceType
	tooMany      bool    // the entry array is longer than the limit (the rest is not kept)
}

// readDocument checks data once (jsontext's validator) and then walks its top level and its
// entries without checking again, each entry's resource kept as the bytes it is in data: as
// fast as reading a body goes, where encoding/json's streaming decoder, which it replaced,
// scanned every resource twice. What it reads is what encoding/json would decode (a fuzz test
// holds it to that decoder). A body that is not one JSON object, or whose entry is not an
// array, is 400.
func readDocument(data []byte, maxEntries int) (document, error) {
	var doc document
	bad := func(err error) (document, error) {
		msg := "the body must be a FHIR Observation or Bundle as a JSON object"
		if err != nil {
			msg += ": " + strings.TrimPrefix(err.Error(), "json: ")
		}
		return document{}, fault.Invalid("%s", msg)
	}
	if !jsonwire.Valid(data) {
		var v any // encoding/json says what is wrong, and where
		return bad(json.Unmarshal(data, &v))
	}
	if bytes.TrimLeft(data, " \t\r\n")[0] != '{' {
		return bad(nil)
	}
	err := jsonwire.Members(data, func(key, v []byte) error {
		switch string(key) {
		case "resourceType":
			_ = jsonwire.String(v, &doc.resourceType) // one that is not a string is judged below, like a wrong one
		case "type":
			_ = jsonwire.String(v, &doc.bundleType)
		case "entry":
			return readEntries(v, &doc, maxEntries)
		}
		return nil
	})
	if err != nil {
		return bad(errors.Unwrap(err)) // not the key Members prefixes
	}
	return doc, nil
}

// readEntries reads the entry array v, one entry at a time; past maxEntries it only counts.
func readEntries(v []byte, doc *document, maxEntries int) error {
	switch {
	case jsonwire.IsNull(v):
		return nil // "entry": null
	case v[0] != '[':
		return errors.New("Bundle.entry must be an array")
	}
	n := 0
	return jsonwire.Elements(v, func(e []byte) error {
		if n++; n > maxEntries {
			doc.tooMany = true
			return nil
		}
		x := entry{index: n - 1}
		resource, request, ok := bundleEntry(e)
		switch {
		case !ok:
			x.err = entryErr(CodeInvalidEntry, "the entry must be an object with a resource (and optionally a request)")
		case len(resource) == 0 || jsonwire.IsNull(resource):
			x.err = entryErr(CodeInvalidEntry, "the entry has no resource")
		case request != nil && (request.method != http.MethodPost || !(request.url == "Observation" || strings.HasSuffix(request.url, "/Observation"))):
			x.err = entryErr(CodeInvalidEntry, "only POST Observation entries are accepted")
		default:
			x.raw = resource
		}
		doc.entries = append(doc.entries, x)
		return nil
	})
}

// entryRequest is Bundle.entry.request.
type entryRequest struct{ method, url string }

// bundleEntry reads one element of Bundle.entry as encoding/json decodes it into a struct of a
// json.RawMessage "resource" and a *struct{Method, URL string} "request": keys match
// case-insensitively, the last of a repeated one counts, and null leaves a field as it was. ok
// is false where encoding/json reports a type error: the entry, its request, or the request's
// method or url is neither null nor of the type it must be.
func bundleEntry(e []byte) (resource []byte, request *entryRequest, ok bool) {
	if jsonwire.IsNull(e) {
		return nil, nil, true
	}
	if e[0] != '{' {
		return nil, nil, false
	}
	ok = true
	_ = jsonwire.Members(e, func(key, v []byte) error {
		switch jsonwire.Fold(key, []string{"resource", "request"}) {
		case "resource":
			resource = v
		case "request":
			switch {
			case jsonwire.IsNull(v):
				request = nil
			case v[0] != '{':
				ok = false
			default:
				if request == nil {
					request = &entryRequest{}
				}
				ok = request.read(v) && ok
			}
		}
		return nil
	})
	return resource, request, ok
}

// read decodes the request object v into r as encoding/json would, reporting false where it
// would report a type error (a method or url that is neither a string nor null).
func (r *entryRequest) read(v []byte) bool {
	ok := true
	_ = jsonwire.Members(v, func(key, v []byte) error {
		var err error
		switch jsonwire.Fold(key, []string{"method", "url"}) {
		case "method":
			err = jsonwire.String(v, &r.method)
		case "url":
			err = jsonwire.String(v, &r.url)
		}
		ok = ok && err == nil
		return nil
	})
	return ok
}

// ndjson handles a FHIR NDJSON stream: one Observation per line, read with a bounded buffer,
// validated and produced chunkSize lines at a time inside one transaction committed at the end.
func (rq *request) ndjson(body io.Reader) ([]string, error) {
	br := bufio.NewReaderSize(body, MaxEntryBytes+2)
	chunk := make([]entry, 0, chunkSize)
	var accepted []string
	flush := func() error {
		recs, ids, err := rq.validate(chunk)
		chunk = chunk[:0]
		if err != nil {
			return err
		}
		accepted = append(accepted, ids...)
		return rq.produce(recs)
	}
	for line := 0; ; line++ {
		b, tooLong, err := readLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			rq.abort()
			return nil, readError(err)
		}
		if b = bytes.TrimSpace(b); len(b) > 0 || tooLong {
			rq.entries++
			if rq.entries > rq.in.cfg.MaxEntries {
				rq.abort()
				return nil, tooManyEntries(rq.in.cfg.MaxEntries)
			}
			e := entry{index: line, raw: bytes.Clone(b)}
			if tooLong {
				e.err = entryErr(CodeEntryTooLarge, "the line is longer than %d bytes", MaxEntryBytes)
			}
			chunk = append(chunk, e)
			if len(chunk) == chunkSize {
				if err := flush(); err != nil {
					rq.abort()
					return nil, err
				}
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
	}
	if len(chunk) > 0 {
		if err := flush(); err != nil {
			rq.abort()
			return nil, err
		}
	}
	if len(accepted) == 0 {
		rq.abort()
		return nil, nil
	}
	if err := rq.commit(); err != nil {
		return nil, err
	}
	return accepted, nil
}

// readLine returns the next line (valid until the next read), or tooLong when it does not fit
// the reader's buffer, in which case the rest of the line has been skipped.
func readLine(br *bufio.Reader) (line []byte, tooLong bool, err error) {
	b, err := br.ReadSlice('\n')
	if !errors.Is(err, bufio.ErrBufferFull) {
		return b, false, err
	}
	for errors.Is(err, bufio.ErrBufferFull) {
		_, err = br.ReadSlice('\n')
	}
	return nil, true, err
}
