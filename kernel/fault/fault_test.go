package fault_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"carehub/kernel/fault"
)

// A NUL byte or invalid UTF-8 that reaches Postgres is the client's bad input, whatever wraps it.
func TestDatabaseTextRefusalIsInvalid(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want fault.Kind
	}{
		{fmt.Errorf("get patient: %w", &pgconn.PgError{Code: "22021", Message: "invalid byte sequence for encoding \"UTF8\": 0x00"}), fault.KindInvalid},
		{fmt.Errorf("append event: %w", &pgconn.PgError{Code: "22P05", Message: "unsupported Unicode escape sequence"}), fault.KindInvalid},
		{fmt.Errorf("insert: %w", &pgconn.PgError{Code: "23505"}), fault.KindInternal},
		{errors.New("plain"), fault.KindInternal},
		{fault.NotFound("patient", "pat_1"), fault.KindNotFound},
	} {
		if got := fault.KindOf(tc.err); got != tc.want {
			t.Errorf("KindOf(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	pg := &pgconn.PgError{Code: "22021", Message: "invalid byte sequence"}
	if f := fault.As(pg); f == nil || f.Kind != fault.KindInvalid || f.Err != pg || strings.Contains(f.Message, pg.Message) {
		t.Fatalf("As: %+v (the database's message is the cause, never the client's message)", f)
	}
}
