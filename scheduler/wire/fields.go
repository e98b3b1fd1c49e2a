package wire

import (
	"fmt"
	"math"
	"time"

	"github.com/kvtier/kvtier/messages"
)

// field is a request field beyond v, op and id: one bit, so that the op
// table (ops.go) says as sets which fields an op allows and requires.
type field uint32

const (
	fTimeout field = 1 << iota
	fReq
	fKeys
	fPrefix
	fOK
	fJob
	fWorker
	fClear
	fClient
	fPKeys // packed keys: in place of fKeys (pkeys.go)
	fN
	fSlots
	fWantSlots
	fNoReply
	fQuiet
	fCalls
	fBlockBytes
	fTopic
)

// fieldSpec is one row of the request's field table.
type fieldSpec struct {
	f    field
	name string
	// set reports whether q gives the field a value. An optional field is
	// sent only then (absent, it decodes to its zero value); a field the op
	// requires is sent always.
	set    func(q *Request) bool
	encode func(w *writer, q *Request)
	decode func(r *reader, q *Request) error // with the value's exact type and bounds
}

// requestFields is the request's field table: one row per field beyond v,
// op and id says its wire name, when a request sends it, and how its value
// is written and read. Which ops take a field is the op table's (ops.go).
// The encoder writes the fields in this order and the decoder reads them
// in it (whatever order they came in), so the first bad one is the one an
// error names.
//
// fieldByName finds a row's field by its wire name, and "pkeys", which
// stands in for "keys" (pkeys.go) and has no row of its own.
//
// Both are set in init: a batch's calls are requests, so the "calls" row
// refers back to the codec that reads the table, which a package-level
// initializer may not.
var (
	requestFields []fieldSpec
	fieldByName   map[string]field
)

func init() {
	requestFields = []fieldSpec{
		{f: fTimeout, name: "timeout_ms", set: func(q *Request) bool { return q.Timeout > 0 },
			encode: encodeTimeout, decode: decodeTimeout},
		{f: fReq, name: "req", set: func(q *Request) bool { return q.Req != nil },
			encode: func(w *writer, q *Request) { encodeReqContext(w, q.Req, "") },
			decode: func(r *reader, q *Request) (err error) { q.Req, err = decodeReqContext(r); return err }},
		{f: fKeys, name: "keys", set: func(q *Request) bool { return len(q.Keys) > 0 },
			encode: func(w *writer, q *Request) { encodeKeys(w, q.Keys) }, decode: decodeRequestKeys},
		boolField(fPrefix, "prefix", func(q *Request) *bool { return &q.Prefix }),
		boolField(fOK, "ok", func(q *Request) *bool { return &q.OK }),
		uintField(fJob, "job", math.MaxUint64, func(q *Request) *messages.JobID { return &q.Job }),
		uintField(fWorker, "worker", MaxWorkers-1, func(q *Request) *int { return &q.Worker }),
		boolField(fClear, "clear", func(q *Request) *bool { return &q.Clear }),
		{f: fClient, name: "client", set: func(q *Request) bool { return q.Client != "" },
			encode: func(w *writer, q *Request) { w.Str(q.Client) },
			decode: func(r *reader, q *Request) (err error) { q.Client, err = r.Str(MaxNameBytes); return err }},
		uintField(fN, "n", MaxKeys, func(q *Request) *int { return &q.N }),
		{f: fSlots, name: "slots", set: func(q *Request) bool { return len(q.Slots) > 0 },
			encode: func(w *writer, q *Request) { encodeSlots(w, q.Slots) },
			decode: func(r *reader, q *Request) (err error) { q.Slots, err = decodeSlots(r, MaxKeys); return err }},
		boolField(fWantSlots, "want_slots", func(q *Request) *bool { return &q.WantSlots }),
		boolField(fNoReply, "noreply", func(q *Request) *bool { return &q.NoReply }),
		boolField(fQuiet, "quiet", func(q *Request) *bool { return &q.Quiet }),
		{f: fCalls, name: "calls", set: func(q *Request) bool { return len(q.Calls) > 0 },
			encode: encodeCalls,
			decode: func(r *reader, q *Request) (err error) { q.Calls, err = decodeCalls(r); return err }},
		uintField(fBlockBytes, "block_bytes", MaxBlockBytes, func(q *Request) *int { return &q.BlockBytes }),
		{f: fTopic, name: "topic", set: func(q *Request) bool { return q.Topic != "" },
			encode: func(w *writer, q *Request) { w.Str(q.Topic) },
			decode: func(r *reader, q *Request) (err error) { q.Topic, err = r.Str(MaxNameBytes); return err }},
	}
	fieldByName = map[string]field{"pkeys": fPKeys}
	for _, fs := range requestFields {
		fieldByName[fs.name] = fs.f
	}
}

// boolField is the row of a bool field: sent when true.
func boolField(f field, name string, at func(q *Request) *bool) fieldSpec {
	return fieldSpec{f: f, name: name,
		set:    func(q *Request) bool { return *at(q) },
		encode: func(w *writer, q *Request) { w.Bool(*at(q)) },
		decode: func(r *reader, q *Request) (err error) { *at(q), err = r.Bool(); return err },
	}
}

// uintField is the row of an unsigned integer field of at most max: sent when
// not 0.
func uintField[T ~int | ~uint64](f field, name string, max uint64, at func(q *Request) *T) fieldSpec {
	return fieldSpec{f: f, name: name,
		set:    func(q *Request) bool { return *at(q) != 0 },
		encode: func(w *writer, q *Request) { w.Uint(uint64(*at(q))) },
		decode: func(r *reader, q *Request) error {
			v, err := r.Uint(max)
			*at(q) = T(v)
			return err
		},
	}
}

// fieldName is the wire name of the first field of set, in table order.
func fieldName(set field) string {
	for _, fs := range requestFields {
		if set&fs.f != 0 {
			return fs.name
		}
	}
	if set&fPKeys != 0 {
		return "pkeys"
	}
	return "?"
}

// encodeTimeout writes the timeout in whole milliseconds, at least 1 (0
// would mean none).
func encodeTimeout(w *writer, q *Request) {
	w.Uint(uint64(max(q.Timeout/time.Millisecond, 1)))
}

func decodeTimeout(r *reader, q *Request) error {
	ms, err := r.Uint(uint64(MaxTimeout / time.Millisecond))
	switch {
	case err != nil:
		return err
	case ms == 0:
		return fmt.Errorf("timeout_ms must be positive")
	}
	q.Timeout = time.Duration(ms) * time.Millisecond
	return nil
}

// decodeRequestKeys reads "keys", or "pkeys" when the request sent those
// (the decoder then set PackedKeys).
func decodeRequestKeys(r *reader, q *Request) (err error) {
	if q.PackedKeys {
		q.Keys, err = decodePackedKeys(r, MaxKeys)
	} else {
		q.Keys, err = decodeKeys(r, MaxKeys)
	}
	return err
}

// encodeCalls writes a batch's calls; one that did not decode (Err set)
// goes as nil, which does not decode either.
func encodeCalls(w *writer, q *Request) {
	w.ArrayLen(len(q.Calls))
	for _, c := range q.Calls {
		if c.Req != nil {
			w.B = append(w.B, EncodeRequest(c.Req)...)
		} else {
			w.Nil()
		}
	}
}
