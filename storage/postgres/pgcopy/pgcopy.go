// Package pgcopy writes the rows of a COPY … FROM STDIN (FORMAT binary) directly, for the
// writers whose COPY is their hot path (processors/observations, the event log, the webhook
// consumer's deliveries).
//
// pgx's CopyFrom takes each row as []any and encodes every value through its type map: a
// string, a float or a time boxed into an interface is an allocation, and a time is wrapped and
// boxed again to be encoded. For the observation writer that was ten allocations a row, a sixth
// of the objects the whole observation path allocates (docs/PERFORMANCE.md). A Rows appends
// the same wire format pgx sends, without an interface: the caller says each value's type.
//
// The format is Postgres's (https://www.postgresql.org/docs/current/sql-copy.html, "Binary
// Format"): a signature, a flags field and a header extension length, then each tuple as a
// 16-bit field count and each field as a 32-bit length (-1 for null) and its bytes, then -1.
package pgcopy

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// signature, flags (no OIDs) and the header extension's length (none).
const header = "PGCOPY\n\xff\r\n\x00" + "\x00\x00\x00\x00" + "\x00\x00\x00\x00"

// y2k is the epoch of Postgres's timestamps, in microseconds since Unix's.
const y2k = 946_684_800_000_000

// Rows is the body of a binary COPY being built: New, then for each row Row and one value per
// column, then Copy. Its zero value is not ready; a Rows may be Reset and used again.
type Rows struct {
	buf     []byte
	columns int
	rows    int
}

// New returns a Rows of columns values a row, with room for size bytes.
func New(columns, size int) *Rows {
	r := &Rows{buf: make([]byte, 0, max(size, len(header)+2)), columns: columns}
	r.Reset()
	return r
}

// Reset empties r, keeping its buffer.
func (r *Rows) Reset() {
	r.buf = append(r.buf[:0], header...)
	r.rows = 0
}

// Len is the number of rows begun.
func (r *Rows) Len() int { return r.rows }

// Row begins a row; the caller then appends exactly one value for each column, in the order
// of the columns Copy names.
func (r *Rows) Row() {
	r.buf = binary.BigEndian.AppendUint16(r.buf, uint16(r.columns))
	r.rows++
}

// Null appends a null value.
func (r *Rows) Null() { r.buf = binary.BigEndian.AppendUint32(r.buf, math.MaxUint32) }

// Text appends s as a text, varchar or json value (their binary form is the text itself).
func (r *Rows) Text(s string) {
	r.buf = binary.BigEndian.AppendUint32(r.buf, uint32(len(s)))
	r.buf = append(r.buf, s...)
}

// Texts appends each of values as Text does.
func (r *Rows) Texts(values ...string) {
	for _, s := range values {
		r.Text(s)
	}
}

// TextOrNull appends s, or null for "".
func (r *Rows) TextOrNull(s string) {
	if s == "" {
		r.Null()
		return
	}
	r.Text(s)
}

// Bytes appends b as a text, varchar, json or bytea value.
func (r *Rows) Bytes(b []byte) {
	r.buf = binary.BigEndian.AppendUint32(r.buf, uint32(len(b)))
	r.buf = append(r.buf, b...)
}

// Append appends the value appendValue appends to the bytes it is given, as Bytes would append
// those bytes: a value written straight into the body, not built and then copied.
func (r *Rows) Append(appendValue func(b []byte) []byte) {
	at := len(r.buf)
	r.buf = appendValue(append(r.buf, 0, 0, 0, 0))
	binary.BigEndian.PutUint32(r.buf[at:], uint32(len(r.buf)-at-4))
}

// JSONB appends b, a JSON text, as a jsonb value: its binary form is a version byte, 1, then
// the text, which Postgres parses as it would the text form.
func (r *Rows) JSONB(b []byte) {
	r.buf = binary.BigEndian.AppendUint32(r.buf, uint32(len(b)+1))
	r.buf = append(append(r.buf, 1), b...)
}

// Float8 appends f as a double precision value.
func (r *Rows) Float8(f float64) {
	r.buf = binary.BigEndian.AppendUint32(r.buf, 8)
	r.buf = binary.BigEndian.AppendUint64(r.buf, math.Float64bits(f))
}

// Int4 appends n as an integer value.
func (r *Rows) Int4(n int32) {
	r.buf = binary.BigEndian.AppendUint32(r.buf, 4)
	r.buf = binary.BigEndian.AppendUint32(r.buf, uint32(n))
}

// Timestamptz appends t as a timestamptz value, to the microsecond (truncated, as pgx does).
func (r *Rows) Timestamptz(t time.Time) {
	r.buf = binary.BigEndian.AppendUint32(r.buf, 8)
	r.buf = binary.BigEndian.AppendUint64(r.buf, uint64(t.Unix()*1_000_000+int64(t.Nanosecond())/1000-y2k))
}

// Copy copies r's rows into table's columns (as many as r has values a row) on conn, in its
// transaction if it is in one, and returns how many rows Postgres stored.
func (r *Rows) Copy(ctx context.Context, conn *pgconn.PgConn, table string, columns []string) (int64, error) {
	quoted := make([]string, len(columns))
	for i, c := range columns {
		quoted[i] = pgx.Identifier{c}.Sanitize()
	}
	sql := "copy " + pgx.Identifier{table}.Sanitize() + " (" + strings.Join(quoted, ", ") + ") from stdin (format binary)"
	body := binary.BigEndian.AppendUint16(r.buf, math.MaxUint16) // the trailer
	tag, err := conn.CopyFrom(ctx, bytes.NewReader(body), sql)
	r.buf = body[:len(body)-2]
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}
