package marketplace

import (
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"

	"carehub/kernel/fault"
)

// ErrBadCursor is returned for a cursor this service did not produce.
var ErrBadCursor = fault.Invalid("invalid cursor: pass the meta.cursor of an earlier response unchanged")

// A cursor is the position of the last row of a page in the listing order (created_at desc, id
// desc): "1.<created_at unix micros>.<id>" in unpadded base64url.
func encodeCursor(at time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte("1." + strconv.FormatInt(at.UnixMicro(), 10) + "." + id))
}

func decodeCursor(cursor string) (time.Time, string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		return time.Time{}, "", err
	}
	version, rest, ok1 := strings.Cut(string(raw), ".")
	micros, id, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || version != "1" || !strings.HasPrefix(id, "ast_") {
		return time.Time{}, "", errors.New("malformed cursor")
	}
	us, err := strconv.ParseInt(micros, 10, 64)
	if err != nil {
		return time.Time{}, "", err
	}
	return time.UnixMicro(us).UTC(), id, nil
}
