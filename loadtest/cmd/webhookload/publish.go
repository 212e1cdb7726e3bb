package main

import (
	"strconv"
	"time"

	"carehub/kernel/jsonwire"
)

// batchBody encodes what a publishing client posts: an array of n copies of one event, whose
// payload names the client, its call and when the call was made (what the receiver reads: the
// order of a client's events, and publish → delivered). The parts that never change are encoded
// once: with json.Marshal each call, the clients spent 3-4 µs of CPU an event, about half what
// the node took to accept it, on the two cores the node runs on.
type batchBody struct {
	prefix []byte // {"projectId":…,"type":…,"payload":{"client":
	suffix []byte // the filler, if any, and the closing braces
	n      int
}

func newBatchBody(project, typ, filler string, n int) batchBody {
	b := batchBody{n: n}
	b.prefix = jsonwire.AppendString(append(b.prefix, `{"projectId":`...), project)
	b.prefix = jsonwire.AppendString(append(b.prefix, `,"type":`...), typ)
	b.prefix = append(b.prefix, `,"payload":{"client":`...)
	if filler != "" {
		b.suffix = jsonwire.AppendString(append(b.suffix, `,"filler":`...), filler)
	}
	b.suffix = append(b.suffix, "}}"...)
	return b
}

// encode is the body of client's call seq, made at sent.
func (b batchBody) encode(client, seq int, sent time.Time) []byte {
	item := make([]byte, 0, len(b.prefix)+len(b.suffix)+64)
	item = strconv.AppendInt(append(item, b.prefix...), int64(client), 10)
	item = strconv.AppendInt(append(item, `,"seq":`...), int64(seq), 10)
	item = strconv.AppendInt(append(item, `,"sentAt":`...), sent.UnixNano(), 10)
	item = append(item, b.suffix...)
	out := make([]byte, 0, b.n*(len(item)+1)+1)
	out = append(out, '[')
	for i := range b.n {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, item...)
	}
	return append(out, ']')
}
