package intake

import (
	"strings"

	"github.com/oklog/ulid/v2"
)

// ulidString is the lowercase ULID text of u, as carehub ids carry it. Any 16 bytes are a valid
// ULID.
func ulidString(u [16]byte) string { return strings.ToLower(ulid.ULID(u).String()) }
