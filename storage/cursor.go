package storage

import (
	"encoding/base64"
	"strconv"
	"strings"
	"time"
)

// EncodeCursor returns the opaque cursor of a keyset position: the time of the last row of a page
// in Unix microseconds and its id, "1.<micros>.<id>" in unpadded base64url. Both stores use this
// one format, so a cursor survives a move between them; the leading version lets it change.
func EncodeCursor(at time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte("1." + strconv.FormatInt(at.UnixMicro(), 10) + "." + id))
}

// DecodeCursor parses a cursor made by EncodeCursor; anything else is ErrBadCursor.
func DecodeCursor(cursor string) (time.Time, string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		return time.Time{}, "", ErrBadCursor
	}
	version, rest, ok1 := strings.Cut(string(raw), ".")
	micros, id, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || version != "1" || id == "" {
		return time.Time{}, "", ErrBadCursor
	}
	us, err := strconv.ParseInt(micros, 10, 64)
	if err != nil {
		return time.Time{}, "", ErrBadCursor
	}
	return time.UnixMicro(us).UTC(), id, nil
}

// DecodeCursorOf parses a cursor made by EncodeCursor over a listing of ids with prefix (ast_,
// prj_); a cursor of another listing is ErrBadCursor.
func DecodeCursorOf(cursor, prefix string) (time.Time, string, error) {
	at, id, err := DecodeCursor(cursor)
	if err != nil || !strings.HasPrefix(id, prefix) {
		return time.Time{}, "", ErrBadCursor
	}
	return at, id, nil
}

// Page sizes of the event and audit queries. Both stores clamp Limit the same way, so a client
// gets the same pages from either.
const (
	DefaultPageSize = 100  // a query without Limit
	MaxPageSize     = 1000 // larger limits are clamped to this
)

// PageSize is the page size a query's limit asks for: DefaultPageSize for 0 or less, at most
// MaxPageSize.
func PageSize(limit int) int {
	switch {
	case limit <= 0:
		return DefaultPageSize
	case limit > MaxPageSize:
		return MaxPageSize
	}
	return limit
}

// TrimPage cuts items, read with one more than limit, to limit, and returns the cursor after the
// last item kept when there was more, "" on the last page. key gives an item's time and id.
func TrimPage[T any](items []T, limit int, key func(T) (time.Time, string)) ([]T, string) {
	if len(items) <= limit {
		return items, ""
	}
	items = items[:limit]
	at, id := key(items[limit-1])
	return items, EncodeCursor(at, id)
}

// CursorKey is an audit record's place in the audit log's order, for TrimPage.
func (r AuditRecord) CursorKey() (time.Time, string) { return r.Time, r.ID }
