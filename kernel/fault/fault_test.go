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

// A database that is down, recovering or full refuses the call as one to retry, naming
// Postgres: a publish during crash recovery answered 500 (the disk-full fault test, 57P03).
func TestDatabaseDownIsUnavailable(t *testing.T) {
	for _, code := range []string{"57P01", "57P02", "57P03", "08006", "53100"} {
		err := fmt.Errorf("append to outbox: %w", &pgconn.PgError{Code: code, Message: "the database system is not yet accepting connections"})
		f := fault.As(err)
		if f == nil || f.Kind != fault.KindUnavailable || f.Details["dependency"] != "postgres" {
			t.Errorf("As(%s) = %+v, want Unavailable naming postgres", code, f)
		}
	}
	// A cancelled statement (57014, statement_timeout) is not the database being down.
	if k := fault.KindOf(&pgconn.PgError{Code: "57014"}); k == fault.KindUnavailable {
		t.Errorf("57014 classified %v", k)
	}
}
