package pgcopy_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"carehub/storage/postgres/pgcopy"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// row is one row of the test table; nil pointers are nulls.
type row struct {
	key   string
	text  *string
	value *float64
	at    time.Time
	doc   string // json and jsonb
	count *int32
}

var columns = []string{"key", "text", "value", "at", "doc", "docb", "count"}

func (r row) appendTo(rows *pgcopy.Rows) {
	rows.Row()
	rows.Text(r.key)
	if r.text == nil {
		rows.Null()
	} else {
		rows.TextOrNull(*r.text) // "" is kept as null by TextOrNull: see values
	}
	if r.value == nil {
		rows.Null()
	} else {
		rows.Float8(*r.value)
	}
	rows.Timestamptz(r.at)
	if len(r.key)%2 == 0 {
		rows.Bytes([]byte(r.doc))
	} else {
		rows.Append(func(b []byte) []byte { return append(b, r.doc...) })
	}
	rows.JSONB([]byte(r.doc))
	if r.count == nil {
		rows.Null()
	} else {
		rows.Int4(*r.count)
	}
}

func (r row) values() []any {
	var text *string
	if r.text != nil && *r.text != "" {
		text = r.text
	}
	return []any{r.key, text, r.value, r.at, []byte(r.doc), []byte(r.doc), r.count}
}

// TestRowsStoreWhatPgxStores copies the same rows with Rows and with pgx's CopyFrom into two
// tables and compares every column as Postgres reads it back: edge values (empty, long and
// multi-byte text, nulls, NaN, infinities and signed zero, times before 2000, far ahead, with
// nanoseconds and in other zones, nested JSON with escapes, the smallest integer) and random ones.
func TestRowsStoreWhatPgxStores(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	for _, table := range []string{"by_rows", "by_pgx"} {
		if _, err := pool.Exec(ctx, `create table `+table+` (key text primary key, text text, value double precision,
			at timestamptz, doc json, docb jsonb, count integer)`); err != nil {
			t.Fatal(err)
		}
	}
	str := func(s string) *string { return &s }
	num := func(f float64) *float64 { return &f }
	count := func(n int32) *int32 { return &n }
	east := time.FixedZone("east", 5*3600+1800)
	rows := []row{
		{key: "empty", text: str(""), value: num(0), at: time.Unix(0, 0), doc: `{}`, count: count(0)},
		{key: "nulls", at: time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), doc: `null`},
		{key: "unicode", text: str("héllo, 世界 \u2028 🩺"), value: num(-0.0), at: time.Date(1999, 12, 31, 23, 59, 59, 999_999_999, time.UTC), doc: `{"a":"\u00e9\n\"q\"","b":[1,2.5e-3,{"c":null}]}`},
		{key: "nan", value: num(math.NaN()), at: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), doc: `[]`, count: count(math.MinInt32)},
		{key: "inf", value: num(math.Inf(1)), at: time.Date(9999, 12, 31, 23, 59, 59, 999_999_000, east), doc: `"s"`},
		{key: "-inf", value: num(math.Inf(-1)), at: time.Date(1969, 7, 20, 20, 17, 40, 123_456_789, east), doc: `123.456`},
		{key: "long", text: str(strings.Repeat("ab\tc", 50_000)), value: num(math.MaxFloat64), at: time.Date(2026, 11, 29, 14, 0, 0, 1, time.UTC), doc: `{"long":"` + strings.Repeat("x", 100_000) + `"}`},
		{key: "tiny", value: num(math.SmallestNonzeroFloat64), at: time.Date(1900, 2, 28, 12, 0, 0, 500, time.UTC), doc: `{"x":1,"x":2}`},
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 500 {
		var text *string
		if r.IntN(4) > 0 {
			b := make([]rune, r.IntN(40))
			for j := range b {
				b[j] = rune(1 + r.IntN(0x2fff))
			}
			text = str(string(b))
		}
		var value *float64
		if r.IntN(4) > 0 {
			value = num(math.Float64frombits(r.Uint64()))
			if math.IsNaN(*value) {
				value = num(r.NormFloat64() * 1e6)
			}
		}
		at := time.Unix(r.Int64N(1<<36)-1<<35, r.Int64N(1e9))
		rows = append(rows, row{key: fmt.Sprintf("r%03d", i), text: text, value: value, at: at,
			doc: fmt.Sprintf(`{"n":%d,"s":%q}`, r.Int64(), fmt.Sprint(r.Float64())), count: count(int32(r.Uint32()))})
	}

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	body := pgcopy.New(len(columns), 0)
	for _, rw := range rows {
		rw.appendTo(body)
	}
	if body.Len() != len(rows) {
		t.Fatalf("Len = %d, want %d", body.Len(), len(rows))
	}
	n, err := body.Copy(ctx, conn.Conn().PgConn(), "by_rows", columns)
	if err != nil || n != int64(len(rows)) {
		t.Fatalf("Copy = %d, %v; want %d rows", n, err, len(rows))
	}
	n, err = pool.CopyFrom(ctx, pgx.Identifier{"by_pgx"}, columns, pgx.CopyFromSlice(len(rows), func(i int) ([]any, error) { return rows[i].values(), nil }))
	if err != nil || n != int64(len(rows)) {
		t.Fatalf("pgx CopyFrom = %d, %v; want %d rows", n, err, len(rows))
	}
	var differ []string
	qr, err := pool.Query(ctx, `select coalesce(a.key, b.key) from by_rows a full join by_pgx b using (key)
		where a.key is null or b.key is null or a.text is distinct from b.text
		or a.value::text is distinct from b.value::text or a.at is distinct from b.at
		or a.doc::text is distinct from b.doc::text or a.docb is distinct from b.docb
		or a.count is distinct from b.count`)
	if err != nil {
		t.Fatal(err)
	}
	if differ, err = pgx.CollectRows(qr, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(differ) > 0 {
		t.Errorf("rows stored differently from pgx's: %v", differ)
	}

	// A Rows is used again after Reset, and what was copied before is not copied twice.
	body.Reset()
	rows[0].key = "again"
	rows[0].appendTo(body)
	if n, err := body.Copy(ctx, conn.Conn().PgConn(), "by_rows", columns); err != nil || n != 1 {
		t.Fatalf("Copy after Reset = %d, %v; want 1 row", n, err)
	}
}

// TestRowsRefusedAsPgxIs: a value Postgres refuses fails the Copy with Postgres's error (a
// data exception, class 22, which the writers tell from a failure to reach Postgres), and the
// connection is usable after it.
func TestRowsRefusedAsPgxIs(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `create table t (key text, doc jsonb)`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, c := range []struct {
		name     string
		key, doc string
	}{
		{"a NUL in text", "a\x00b", `{}`},
		{"not JSON", "k", `{"a":`},
		{"a NUL escape in jsonb", "k", `{"a":"\u0000"}`},
	} {
		body := pgcopy.New(2, 0)
		body.Row()
		body.Text(c.key)
		body.JSONB([]byte(c.doc))
		_, err := body.Copy(ctx, conn.Conn().PgConn(), "t", []string{"key", "doc"})
		var pg *pgconn.PgError
		if !errors.As(err, &pg) || !strings.HasPrefix(pg.Code, "22") {
			t.Errorf("%s: Copy err = %v, want a data exception (22…)", c.name, err)
		}
		var one int
		if err := conn.QueryRow(ctx, `select 1`).Scan(&one); err != nil {
			t.Fatalf("%s: the connection after the refused copy: %v", c.name, err)
		}
	}
}
