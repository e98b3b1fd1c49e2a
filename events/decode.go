package events

import (
	"bytes"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// maxDepth bounds the nesting of values the decoder walks (extra keys are
// arbitrary tuples in vLLM).
const maxDepth = 16

// DecodeBatch decodes one payload: the batch as an array [ts, events] or
// [ts, events, data_parallel_rank], or as a map with those keys (newer
// vLLM); each event as a map tagged by "type" or as a legacy array whose
// first element is the type. Unknown map keys and unknown event types are
// skipped (an unknown type decodes to an Event with only Type set); known
// fields must have their documented types. Every length is checked against
// the bytes left, so a hostile payload cannot make it allocate more than a
// small multiple of its own size.
func DecodeBatch(payload []byte) (*Batch, error) {
	r := bytes.NewReader(payload)
	d := &reader{r: r, dec: msgpack.NewDecoder(r)}
	b := d.batch()
	if d.err == nil && r.Len() > 0 {
		d.fail("%d trailing bytes", r.Len())
	}
	if d.err != nil {
		return nil, d.err
	}
	return b, nil
}

// reader sticks at the first error; every method returns a zero value
// once it has failed.
type reader struct {
	r   *bytes.Reader
	dec *msgpack.Decoder
	err error
}

func (d *reader) fail(format string, a ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, a...)...)
	}
}

func (d *reader) wrap(what string, err error) bool {
	if err != nil {
		d.fail("%s: %v", what, err)
		return true
	}
	return d.err != nil
}

func (d *reader) peek() byte {
	if d.err != nil {
		return 0
	}
	c, err := d.dec.PeekCode()
	if d.wrap("peek", err) {
		return 0
	}
	return c
}

func (d *reader) isNil() bool {
	if d.peek() != msgpcode.Nil || d.err != nil {
		return false
	}
	d.wrap("nil", d.dec.DecodeNil())
	return true
}

// length checks a declared element count against the bytes left.
func (d *reader) length(n int, err error, what string) int {
	if d.wrap(what, err) {
		return 0
	}
	if n < 0 || n > d.r.Len() {
		d.fail("%s of %d elements in %d bytes", what, n, d.r.Len())
		return 0
	}
	return n
}

func (d *reader) arrayLen(what string) int {
	n, err := d.dec.DecodeArrayLen()
	return d.length(n, err, what)
}

func (d *reader) mapLen(what string) int {
	n, err := d.dec.DecodeMapLen()
	return d.length(n, err, what)
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isString(c byte) bool {
	return msgpcode.IsFixedString(c) || c == msgpcode.Str8 || c == msgpcode.Str16 || c == msgpcode.Str32
}

func isBin(c byte) bool { return c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32 }

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Uint64) ||
		(c >= msgpcode.Int8 && c <= msgpcode.Int64)
}

func (d *reader) str(what string) string {
	if c := d.peek(); d.err == nil && !isString(c) && !isBin(c) {
		d.fail("%s: want a string, got code %#x", what, c)
		return ""
	}
	if d.err != nil {
		return ""
	}
	n, err := d.dec.DecodeBytesLen()
	if d.length(n, err, what); d.err != nil {
		return ""
	}
	buf := make([]byte, n)
	if _, err := readFull(d.r, buf); d.wrap(what, err) {
		return ""
	}
	return string(buf)
}

func readFull(r *bytes.Reader, buf []byte) (int, error) {
	n, err := r.Read(buf)
	if err == nil && n < len(buf) {
		return n, fmt.Errorf("short read")
	}
	return n, err
}

func (d *reader) int64(what string) int64 {
	if c := d.peek(); d.err == nil && !isInt(c) {
		d.fail("%s: want an int, got code %#x", what, c)
		return 0
	}
	if d.err != nil {
		return 0
	}
	if d.peek() == msgpcode.Uint64 {
		v, err := d.dec.DecodeUint64()
		if d.wrap(what, err) {
			return 0
		}
		if v > math.MaxInt64 {
			d.fail("%s: %d out of range", what, v)
			return 0
		}
		return int64(v)
	}
	v, err := d.dec.DecodeInt64()
	d.wrap(what, err)
	return v
}

func (d *reader) float(what string) float64 {
	c := d.peek()
	if d.err != nil {
		return 0
	}
	if isInt(c) {
		return float64(d.int64(what))
	}
	if c != msgpcode.Float && c != msgpcode.Double {
		d.fail("%s: want a number, got code %#x", what, c)
		return 0
	}
	v, err := d.dec.DecodeFloat64()
	d.wrap(what, err)
	return v
}

// hash reads an int (vLLM's int form; a negative legacy Python hash keeps
// its two's-complement bits) or bytes.
func (d *reader) hash(what string) Hash {
	c := d.peek()
	switch {
	case d.err != nil:
		return Hash{}
	case isBin(c) || isString(c):
		return Hash{Bytes: []byte(d.str(what)), IsBytes: true}
	case c == msgpcode.Uint64:
		v, err := d.dec.DecodeUint64()
		d.wrap(what, err)
		return Hash{Int: v}
	case isInt(c):
		return Hash{Int: uint64(d.int64(what))}
	}
	d.fail("%s: want an int or bytes, got code %#x", what, c)
	return Hash{}
}

func (d *reader) hashes(what string) []Hash {
	n := d.arrayLen(what)
	out := make([]Hash, 0, n)
	for range n {
		out = append(out, d.hash(what))
	}
	return out
}

func (d *reader) optHash(what string) *Hash {
	if d.isNil() || d.err != nil {
		return nil
	}
	h := d.hash(what)
	return &h
}

func (d *reader) optStr(what string) string {
	if d.isNil() {
		return ""
	}
	return d.str(what)
}

func (d *reader) optInt(what string) *int64 {
	if d.isNil() || d.err != nil {
		return nil
	}
	v := d.int64(what)
	return &v
}

func (d *reader) tokens(what string) []int32 {
	n := d.arrayLen(what)
	out := make([]int32, 0, n)
	for range n {
		v := d.int64(what)
		if v < math.MinInt32 || v > math.MaxInt32 {
			d.fail("%s: token %d out of range", what, v)
		}
		if d.err != nil {
			return nil
		}
		out = append(out, int32(v))
	}
	return out
}

// extraKeys reads vLLM's list of per-block tuples (or nil); elements that
// are not strings are rendered with fmt.
func (d *reader) extraKeys() [][]string {
	if d.isNil() || d.err != nil {
		return nil
	}
	n := d.arrayLen("extra_keys")
	out := make([][]string, 0, n)
	for range n {
		if d.isNil() {
			out = append(out, nil)
			continue
		}
		if c := d.peek(); d.err == nil && !isArray(c) {
			d.fail("extra_keys: want a tuple, got code %#x", c)
		}
		m := d.arrayLen("extra_keys entry")
		keys := make([]string, 0, m)
		for range m {
			keys = append(keys, d.anyString(0))
		}
		if d.err != nil {
			return nil
		}
		out = append(out, keys)
	}
	return out
}

// anyString reads any value, rendering it as text (bounded depth).
func (d *reader) anyString(depth int) string {
	c := d.peek()
	switch {
	case d.err != nil:
		return ""
	case depth > maxDepth:
		d.fail("values nested deeper than %d", maxDepth)
		return ""
	case isString(c):
		return d.str("value")
	case isArray(c):
		n := d.arrayLen("value")
		parts := make([]string, 0, n)
		for range n {
			parts = append(parts, d.anyString(depth+1))
		}
		return fmt.Sprint(parts)
	case isMap(c):
		n := d.mapLen("value")
		for range 2 * n {
			d.anyString(depth + 1)
		}
		return "{…}"
	}
	v, err := d.dec.DecodeInterfaceLoose()
	if d.wrap("value", err) {
		return ""
	}
	return fmt.Sprint(v)
}

// skip skips one value of any kind (bounded depth).
func (d *reader) skip(depth int) {
	c := d.peek()
	switch {
	case d.err != nil:
	case depth > maxDepth:
		d.fail("values nested deeper than %d", maxDepth)
	case isArray(c):
		for range d.arrayLen("skipped value") {
			d.skip(depth + 1)
		}
	case isMap(c):
		for range 2 * d.mapLen("skipped value") {
			d.skip(depth + 1)
		}
	default:
		d.wrap("skipped value", d.dec.Skip())
	}
}

func (d *reader) batch() *Batch {
	b := &Batch{}
	c := d.peek()
	switch {
	case d.err != nil:
		return nil
	case isArray(c):
		n := d.arrayLen("batch")
		if d.err == nil && (n < 2 || n > 3) {
			d.fail("batch of %d elements (want 2 or 3)", n)
			return nil
		}
		b.TS = d.float("ts")
		b.Events = d.events()
		if n == 3 {
			b.dpRank(d)
		}
	case isMap(c):
		n := d.mapLen("batch")
		var sawTS, sawEvents bool
		for range n {
			switch key := d.str("batch key"); key {
			case "ts":
				b.TS, sawTS = d.float("ts"), true
			case "events":
				b.Events, sawEvents = d.events(), true
			case "data_parallel_rank":
				b.dpRank(d)
			default:
				d.skip(0)
			}
		}
		if d.err == nil && (!sawTS || !sawEvents) {
			d.fail("batch map without ts or events")
		}
	default:
		d.fail("batch: want an array or a map, got code %#x", c)
	}
	return b
}

func (b *Batch) dpRank(d *reader) {
	if v := d.optInt("data_parallel_rank"); v != nil {
		b.DPRank, b.HasDPRank = *v, true
	}
}

func (d *reader) events() []Event {
	n := d.arrayLen("events")
	out := make([]Event, 0, n)
	for range n {
		e := d.event()
		if d.err != nil {
			return nil
		}
		out = append(out, e)
	}
	return out
}

func (d *reader) event() Event {
	c := d.peek()
	switch {
	case d.err != nil:
	case isMap(c):
		return d.mapEvent()
	case isArray(c):
		return d.arrayEvent()
	default:
		d.fail("event: want a map or an array, got code %#x", c)
	}
	return Event{}
}

// mapEvent reads the map form; "type" may come anywhere in the map.
func (d *reader) mapEvent() Event {
	var e Event
	for range d.mapLen("event") {
		key := d.str("event key")
		if d.err != nil {
			return e
		}
		if key == "type" {
			e.Type = d.str("type")
			continue
		}
		if !d.field(&e, key) {
			d.skip(0)
		}
	}
	if d.err == nil && e.Type == "" {
		d.fail("event map without a type")
	}
	return e
}

// Positional fields of the legacy array form, after the type tag.
var arrayFields = map[string][]string{
	TypeBlockStored: {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
		"medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
		"kv_cache_spec_sliding_window", "locality", "ownership", "session_id"},
	TypeBlockRemoved:     {"block_hashes", "medium", "group_idx", "locality", "ownership"},
	TypeAllBlocksCleared: {},
}

func (d *reader) arrayEvent() Event {
	var e Event
	n := d.arrayLen("event")
	if d.err == nil && n == 0 {
		d.fail("empty event array")
	}
	if d.err != nil {
		return e
	}
	e.Type = d.str("type")
	names := arrayFields[e.Type]
	for i := 1; i < n && d.err == nil; i++ {
		if i-1 >= len(names) || !d.field(&e, names[i-1]) {
			d.skip(0)
		}
	}
	return e
}

// field reads the value of a known field into e; false for unknown names
// (the caller skips the value).
func (d *reader) field(e *Event, name string) bool {
	switch name {
	case "block_hashes":
		e.BlockHashes = d.hashes(name)
	case "parent_block_hash":
		e.Parent = d.optHash(name)
	case "token_ids":
		e.TokenIDs = d.tokens(name)
	case "block_size":
		e.BlockSize = int(d.int64(name))
	case "lora_id":
		e.LoRAID = d.optInt(name)
	case "medium":
		e.Medium = d.optStr(name)
	case "lora_name":
		e.LoRAName = d.optStr(name)
	case "extra_keys":
		e.ExtraKeys = d.extraKeys()
	case "group_idx":
		if v := d.optInt(name); v != nil {
			if *v < 0 || *v > math.MaxUint32 {
				d.fail("group_idx %d out of range", *v)
			}
			g := uint32(*v)
			e.GroupIdx = &g
		}
	case "kv_cache_spec_kind":
		e.SpecKind = d.optStr(name)
	case "kv_cache_spec_sliding_window":
		e.Window = d.optInt(name)
	case "locality":
		e.Locality = d.optStr(name)
	case "ownership":
		e.Ownership = d.optStr(name)
	case "session_id":
		e.SessionID = d.optStr(name)
	default:
		return false
	}
	return true
}
