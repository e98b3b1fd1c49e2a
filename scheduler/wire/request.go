package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"time"

	"github.com/kvtier/kvtier/internal/msgp"
	"github.com/kvtier/kvtier/messages"
)

// Version is the protocol version this package speaks.
const Version = 1

// Bounds every decoder enforces (docs/PROTOCOL.md lists them).
const (
	MaxFrameBytes     = 32 << 20 // one request or reply frame
	MaxKeys           = 1 << 16  // keys in one call
	MaxNamespaceBytes = 64
	MaxRequestIDBytes = 256
	MaxTokens         = 4 << 20 // token ids in one ReqContext
	MaxTiers          = 16
	MaxTierBytes      = 64
	MaxNameBytes      = 256 // LoRA name, client name
	MaxExtraKeys      = 64
	MaxExtraKeyBytes  = 1024
	MaxWorkers        = 1024
	MaxBlockBytes     = 1 << 30 // bytes per block an engine may declare in its hello
	MaxTimeout        = 10 * time.Minute
	maxFields         = 32
)

// MaxBatchCalls bounds the calls of one batch.
const MaxBatchCalls = 4096

// Request is one decoded engine call.
type Request struct {
	Op      Op
	ID      uint64               // chosen by the client, echoed in the reply
	Timeout time.Duration        // the client's deadline for this call; 0 = the daemon's default
	Req     *messages.ReqContext // request-scoped ops
	Keys    []messages.Key       // key-carrying ops
	// PackedKeys: the keys came as "pkeys" (decoder); send them so when they
	// can be (encoder: one namespace, one hash length; the daemon's hello
	// said packed_keys).
	PackedKeys bool
	Prefix     bool           // lookup
	OK         bool           // complete_store, job_done
	Job        messages.JobID // job_done
	Worker     int            // job_done
	Clear      bool           // pause
	Client     string         // hello: a name for logs
	// Topic: hello: the topic of the engine's own KV events (vLLM's
	// kv_events_config topic, e.g. kv@<pod>@<model> as llm-d sets it);
	// kvtierd announces the blocks this engine can load under it too.
	Topic string
	// BlockBytes: hello: the bytes one block of this engine takes in a slot
	// (every TP worker's shard of one offloaded chunk); 0 = not declared. A
	// daemon started with no block size sizes its slots from the first.
	BlockBytes int
	WantSlots  bool  // lookup: answer each HIT's slot too
	N          int   // grant: slots of credit asked for
	Slots      []int // store: the credited slot of each key
	// NoReply: the caller reads no answer (fire-and-forget); the daemon
	// sends none, success or error. Any op but hello and batch may say so.
	NoReply bool
	// Quiet: the daemon answers only if the call fails (its error reply
	// names the op); a success sends nothing. Same ops as NoReply.
	Quiet bool
	// Calls: a batch's calls, in the order sent (each as if it came in a
	// frame of its own); a call that did not decode has Err set instead.
	Calls []Call
}

// Call is one call of a batch: decoded, or why not (a *DecodeError, with
// the call's id when it was read).
type Call struct {
	Req *Request
	Err error
}

// Replies reports whether the daemon answers q when it succeeds.
func (q *Request) Replies() bool { return !q.NoReply && !q.Quiet }

// RepliesOnError reports whether the daemon answers q when it fails.
func (q *Request) RepliesOnError() bool { return !q.NoReply }

// DecodeRequest decodes one request frame. Its errors are *DecodeError.
// Decoded strings and keys never alias frame.
func DecodeRequest(frame []byte) (*Request, error) {
	if len(frame) > MaxFrameBytes {
		return nil, &DecodeError{Code: CodeBadRequest, Msg: fmt.Sprintf("frame of %d bytes (max %d)", len(frame), MaxFrameBytes)}
	}
	d := requestDecoder{r: reader{B: frame}}
	return d.decode()
}

// decodeCalls reads a batch's array of request maps, each decoded as a
// frame of its own (a nested batch is refused).
func decodeCalls(r *reader) ([]Call, error) {
	n, err := r.ArrayLen(MaxBatchCalls, 1)
	if err != nil {
		return nil, err
	}
	calls := make([]Call, n)
	for i := range calls {
		start := r.Off
		if err := r.Skip(0); err != nil {
			return nil, fmt.Errorf("call %d: %w", i, err)
		}
		d := requestDecoder{r: reader{B: r.B[start:r.Off]}}
		q, err := d.decode()
		if err == nil && q.Op == OpBatch {
			q, err = nil, d.fail(CodeBadRequest, "a batch inside a batch")
		}
		calls[i] = Call{Req: q, Err: err}
	}
	return calls, nil
}

type requestDecoder struct {
	r      reader
	req    Request
	hasID  bool
	opName string
	// offsets[i] is where the value of the field with bit i starts; valid
	// for the fields seen (an array, not a map: a call's decoding then
	// allocates nothing for it).
	offsets [fieldBits]int
}

// fieldBits is how many request fields there can be: one bit each.
const fieldBits = 32

// at is where f's value starts in the frame (f seen).
func (d *requestDecoder) at(f field) *int { return &d.offsets[bits.TrailingZeros32(uint32(f))] }

func (d *requestDecoder) fail(code Code, format string, a ...any) error {
	return &DecodeError{Code: code, ID: d.req.ID, HasID: d.hasID, Op: d.opName, Msg: fmt.Sprintf(format, a...)}
}

func (d *requestDecoder) decode() (*Request, error) {
	n, err := d.r.MapLen(maxFields)
	if err != nil {
		return nil, d.fail(CodeBadRequest, "request: %v", err)
	}
	// Pass 1: v, op and id wherever they are; remember where the rest are.
	var version uint64
	var seen field
	var hasV, hasOp bool
	var late error // a field error found before "id" was read: reported after the scan, with the id
	for range n {
		// NB: names are compared in the frame's bytes: a string each would
		// be most of a small call's allocations.
		name, err := d.r.StrBytes(32)
		if err != nil {
			return nil, d.fail(CodeBadRequest, "field name: %v", err)
		}
		switch string(name) {
		case "v", "op", "id":
			if err := d.header(string(name), &version, &hasV, &hasOp); err != nil {
				return nil, err
			}
			continue
		}
		f, ok := fieldByName[string(name)]
		switch {
		case !ok && late == nil:
			late = fmt.Errorf("unknown field %q", name)
		case ok && seen&f != 0 && late == nil:
			late = fmt.Errorf("field %q repeated", name)
		case ok:
			seen |= f
			*d.at(f) = d.r.Off
		}
		// NB: skip the value either way, so that an "id" after a bad field is
		// still read and the error reply names the request.
		if err := d.r.Skip(0); err != nil {
			return nil, d.fail(CodeBadRequest, "field %q: %v", name, err)
		}
	}
	if d.r.Left() != 0 {
		return nil, d.fail(CodeBadRequest, "%d bytes after the request map", d.r.Left())
	}
	if late != nil {
		return nil, d.fail(CodeBadRequest, "%v", late)
	}
	switch {
	case !hasV:
		return nil, d.fail(CodeBadRequest, "missing field \"v\" (protocol version)")
	case version != Version:
		return nil, d.fail(CodeBadVersion, "protocol version %d (this daemon speaks %d)", version, Version)
	case !d.hasID:
		return nil, d.fail(CodeBadRequest, "missing field \"id\"")
	case !hasOp:
		return nil, d.fail(CodeBadRequest, "missing field \"op\"")
	}
	op, ok := OpByName(d.opName)
	if !ok {
		return nil, d.fail(CodeUnknownOp, "unknown operation %q", d.opName)
	}
	d.req.Op = op
	s := ops[op].fields()
	if seen&fPKeys != 0 {
		// pkeys stands in for keys: allowed and required where keys is.
		if seen&fKeys != 0 {
			return nil, d.fail(CodeBadRequest, "fields \"keys\" and \"pkeys\": one or the other")
		}
		if s.allowed&fKeys == 0 {
			return nil, d.fail(CodeBadRequest, "%s takes no field \"pkeys\"", op)
		}
		seen = seen&^fPKeys | fKeys
		*d.at(fKeys), d.req.PackedKeys = *d.at(fPKeys), true
	}
	if extra := seen &^ s.allowed; extra != 0 {
		return nil, d.fail(CodeBadRequest, "%s takes no field %q", op, fieldName(extra))
	}
	if missing := s.required &^ seen; missing != 0 {
		return nil, d.fail(CodeBadRequest, "%s needs field %q", op, fieldName(missing))
	}
	// Pass 2: the op's fields, each with its exact type and bounds.
	for i := range requestFields {
		fs := &requestFields[i]
		if seen&fs.f == 0 {
			continue
		}
		d.r.Off = *d.at(fs.f)
		if err := fs.decode(&d.r, &d.req); err != nil {
			code := CodeBadRequest
			if errors.Is(err, messages.ErrBadKey) {
				code = CodeBadKey
			}
			name := fs.name
			if fs.f == fKeys && d.req.PackedKeys {
				name = "pkeys"
			}
			return nil, d.fail(code, "field %q: %v", name, err)
		}
	}
	return &d.req, nil
}

func (d *requestDecoder) header(name string, version *uint64, hasV, hasOp *bool) error {
	var err error
	switch name {
	case "v":
		if *hasV {
			return d.fail(CodeBadRequest, "field \"v\" repeated")
		}
		*hasV = true
		if *version, err = d.r.Uint(math.MaxUint32); err != nil {
			return d.fail(CodeBadRequest, "field \"v\": %v", err)
		}
	case "op":
		if *hasOp {
			return d.fail(CodeBadRequest, "field \"op\" repeated")
		}
		*hasOp = true
		var name []byte
		if name, err = d.r.StrBytes(32); err != nil {
			return d.fail(CodeBadRequest, "field \"op\": %v", err)
		}
		d.opName = opName(name)
	case "id":
		if d.hasID {
			return d.fail(CodeBadRequest, "field \"id\" repeated")
		}
		id, err := d.r.Uint(math.MaxUint64)
		if err != nil {
			return d.fail(CodeBadRequest, "field \"id\": %v", err)
		}
		d.req.ID, d.hasID = id, true
	}
	return nil
}

// decodeSlots reads an array of slot indexes (each < 2^31).
func decodeSlots(r *reader, max int) ([]int, error) {
	n, err := r.ArrayLen(max, 1)
	if err != nil {
		return nil, err
	}
	out := make([]int, n)
	for i := range out {
		v, err := r.Uint(math.MaxInt32)
		if err != nil {
			return nil, fmt.Errorf("slot %d: %w", i, err)
		}
		out[i] = int(v)
	}
	return out, nil
}

// decodeKeys reads an array of keys, each [namespace str, hash bin, group uint].
func decodeKeys(r *reader, max int) ([]messages.Key, error) {
	n, err := r.ArrayLen(max, 1)
	if err != nil {
		return nil, err
	}
	// Each key takes at least 4 bytes (fixarray, fixstr, bin8 header): the
	// allocation is bounded by the frame, not by the claimed count alone.
	if 4*n > r.Left() {
		return nil, errShort
	}
	keys := make([]messages.Key, n)
	var lastNS string
	for i := range keys {
		if keys[i], err = decodeKey(r, &lastNS); err != nil {
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
	}
	return keys, nil
}

func decodeKey(r *reader, lastNS *string) (messages.Key, error) {
	var k messages.Key
	n, err := r.ArrayLen(3, 1)
	if err != nil {
		return k, err
	}
	if n != 3 {
		return k, fmt.Errorf("a key is [namespace, hash, group], got %d elements", n)
	}
	ns, err := r.StrBytes(MaxNamespaceBytes)
	if err != nil {
		return k, fmt.Errorf("namespace: %w", err)
	}
	// NB: keys of one call nearly always share a namespace: reuse the string.
	if string(ns) != *lastNS {
		*lastNS = string(canonicalNamespace(ns))
	}
	// NB: an empty hash decodes; the node refuses it with ErrBadKey, as it
	// does in process. A hash too long to be one is refused here, as BAD_KEY.
	c, _ := r.Peek()
	hash, err := r.Bin(messages.MaxHashBytes)
	if err != nil {
		if c >= 0xc4 && c <= 0xc6 && err != errShort {
			return k, fmt.Errorf("%w: %w", messages.ErrBadKey, err)
		}
		return k, err
	}
	g, err := r.Uint(math.MaxUint32)
	if err != nil {
		return k, err
	}
	return messages.Key{Namespace: messages.Namespace(*lastNS), Hash: string(hash), Group: uint32(g)}, nil
}

// decodeReqContext reads a ReqContext map; only "id" is required.
func decodeReqContext(r *reader) (*messages.ReqContext, error) {
	n, err := r.MapLen(16)
	if err != nil {
		return nil, err
	}
	c := &messages.ReqContext{}
	var seen uint32 // a bit per reqFields index
	for range n {
		b, err := r.StrBytes(32)
		if err != nil {
			return nil, err
		}
		i, known := reqFieldIndex[string(b)]
		if !known {
			return nil, fmt.Errorf("req.%s: unknown field", b)
		}
		if seen&(1<<i) != 0 {
			return nil, fmt.Errorf("req field %q repeated", b)
		}
		seen |= 1 << i
		if err := decodeReqField(r, c, reqFields[i]); err != nil {
			return nil, fmt.Errorf("req.%s: %w", reqFields[i], err)
		}
	}
	if seen&1 == 0 || c.RequestID == "" { // NB: reqFields[0] is "id"
		return nil, fmt.Errorf("req needs a non-empty \"id\"")
	}
	return c, nil
}

// reqFields are the names of a ReqContext's fields on the wire, "id"
// first; decodeReqField reads each. reqFieldIndex finds a name's place, so
// that a call's field names are looked up in the frame's bytes.
var (
	reqFields = []string{"id", "workers", "tiers", "peers", "parent", "tokens", "block_size", "lora_id",
		"lora_name", "extra", "kv_cache_spec_kind", "sliding_window", "session_id"}
	reqFieldIndex = func() map[string]uint {
		m := make(map[string]uint, len(reqFields))
		for i, f := range reqFields {
			m[f] = uint(i)
		}
		return m
	}()
)

func decodeReqField(r *reader, c *messages.ReqContext, name string) error {
	var err error
	switch name {
	case "id":
		c.RequestID, err = r.Str(MaxRequestIDBytes)
	case "workers":
		var w uint64
		w, err = r.Uint(MaxWorkers)
		c.Workers = int(w)
	case "tiers":
		c.TierFilter, err = decodeStrings(r, MaxTiers, MaxTierBytes)
	case "peers":
		c.PeerSources, err = decodeStrings(r, MaxTiers, MaxTierBytes)
	case "parent":
		if r.IsNil() {
			return nil
		}
		var p []byte
		if p, err = r.Bin(messages.MaxHashBytes); err == nil {
			c.ParentBlockHash = append([]byte(nil), p...)
		}
	case "tokens":
		var p []byte
		if p, err = r.Bin(4 * MaxTokens); err != nil {
			return err
		}
		if len(p)%4 != 0 {
			return fmt.Errorf("%d bytes is not a whole number of int32 token ids", len(p))
		}
		if len(p) == 0 {
			return nil // as absent: the encoder leaves empty lists out
		}
		c.TokenIDs = make([]int32, len(p)/4)
		for i := range c.TokenIDs {
			c.TokenIDs[i] = int32(binary.LittleEndian.Uint32(p[4*i:]))
		}
	case "block_size":
		var b uint64
		b, err = r.Uint(1 << 20)
		c.BlockSize = int(b)
	case "lora_id":
		var id int64
		id, err = r.Int(math.MinInt32, math.MaxInt32)
		c.LoRAID = int(id)
	case "lora_name":
		c.LoRAName, err = r.Str(MaxNameBytes)
	case "extra":
		c.ExtraKeys, err = decodeStrings(r, MaxExtraKeys, MaxExtraKeyBytes)
	case "kv_cache_spec_kind":
		c.SpecKind, err = r.Str(MaxTierBytes)
	case "sliding_window":
		var v uint64
		v, err = r.Uint(1 << 30)
		c.SlidingWindow = int(v)
	case "session_id":
		c.SessionID, err = r.Str(MaxRequestIDBytes)
	default:
		return fmt.Errorf("unknown field")
	}
	return err
}

func decodeStrings(r *reader, maxN, maxLen int) ([]string, error) {
	n, err := r.ArrayLen(maxN, 1)
	if err != nil || n == 0 {
		return nil, err // empty as absent: the encoder leaves empty lists out
	}
	out := make([]string, n)
	for i := range out {
		if out[i], err = r.Str(maxLen); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// EncodeRequest encodes q as a request frame of protocol Version: v, op
// and id, then the fields of the table (fields.go) that q's op requires, or
// allows and q sets.
func EncodeRequest(q *Request) []byte {
	w := writer{B: make([]byte, 0, 64+len(q.Keys)*48)}
	s := ops[q.Op].fields()
	sent := func(fs *fieldSpec) bool { return s.allowed&fs.f != 0 && (s.required&fs.f != 0 || fs.set(q)) }
	nf := 3
	for i := range requestFields {
		if sent(&requestFields[i]) {
			nf++
		}
	}
	w.MapLen(nf)
	w.Str("v")
	w.Uint(Version)
	w.Str("op")
	w.Str(q.Op.String())
	w.Str("id")
	w.Uint(q.ID)
	for i := range requestFields {
		fs := &requestFields[i]
		switch {
		case !sent(fs):
		case fs.f == fKeys && q.PackedKeys && packable(q.Keys):
			w.Str("pkeys") // in place of "keys" (pkeys.go)
			encodePackedKeys(&w, q.Keys)
		default:
			w.Str(fs.name)
			fs.encode(&w, q)
		}
	}
	return w.B
}

// encodeSlots writes slot indexes as an array (decodeSlots reads it).
func encodeSlots(w *writer, slots []int) {
	w.ArrayLen(len(slots))
	for _, s := range slots {
		w.Uint(uint64(s))
	}
}

func encodeKeys(w *writer, keys []messages.Key) {
	w.ArrayLen(len(keys))
	for _, k := range keys {
		w.ArrayLen(3)
		w.Str(string(k.Namespace))
		w.BinString(k.Hash)
		w.Uint(uint64(k.Group))
	}
}

// encodeReqContext writes c (nil as msgpack nil); a non-empty strip is
// removed from the front of the request id.
func encodeReqContext(w *writer, c *messages.ReqContext, strip string) {
	if c == nil {
		w.Nil()
		return
	}
	n := 1 + msgp.Count(c.Workers != 0, len(c.TierFilter) > 0, len(c.PeerSources) > 0,
		c.ParentBlockHash != nil, c.SpecKind != "", c.SlidingWindow != 0, c.SessionID != "")
	prov := msgp.Prov{Tokens: c.TokenIDs, BlockSize: c.BlockSize, LoRAID: c.LoRAID, LoRAName: c.LoRAName, Extra: c.ExtraKeys}
	w.MapLen(n + prov.Fields())
	w.Str("id")
	id := c.RequestID
	if strip != "" && len(id) >= len(strip) && id[:len(strip)] == strip {
		id = id[len(strip):]
	}
	w.Str(id)
	w.OptUint("workers", uint64(c.Workers))
	w.OptStrs("tiers", c.TierFilter)
	w.OptStrs("peers", c.PeerSources)
	if c.ParentBlockHash != nil { // NB: not OptBin: an empty parent hash is sent
		w.Str("parent")
		w.Bin(c.ParentBlockHash)
	}
	w.WriteProv(&prov)
	w.OptStr("kv_cache_spec_kind", c.SpecKind)
	w.OptUint("sliding_window", uint64(c.SlidingWindow))
	w.OptStr("session_id", c.SessionID)
}
