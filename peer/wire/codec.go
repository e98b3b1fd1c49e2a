package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
)

// Bounds of the codec beyond those in frames.go (docs/PROTOCOL.md, "Peer
// protocol", lists them all).
const (
	MaxBlockBytes = 1 << 30   // Hello/Welcome block_bytes: 1..MaxBlockBytes
	MaxSlots      = 1<<31 - 1 // Hello/Welcome slots: 1..MaxSlots; Fetch dest: 0..MaxSlots-1
	maxFields     = 64        // entries of one map, in any version
	maxNameBytes  = 64        // a field or op name, in any version
	minKeyBytes   = 6         // the shortest encoded key: [fixstr "", bin8 of 1 byte, fixint]
	opUnknown     = op(0)     // an op name this version does not know
	versionMax    = math.MaxUint32
)

// op is a frame type on the wire.
type op uint8

const (
	opHello op = iota + 1
	opWelcome
	opAuth
	opReady
	opRefuse
	opLookup
	opLookupResp
	opFetch
	opTransferDone
	opAbort
	opAbortAck
	opPing
	opPong
	opBye
	opEnd
)

var opNames = [opEnd]string{
	opHello: "hello", opWelcome: "welcome", opAuth: "auth", opReady: "ready",
	opRefuse: "refuse", opLookup: "lookup", opLookupResp: "lookup_resp",
	opFetch: "fetch", opTransferDone: "transfer_done", opAbort: "abort",
	opAbortAck: "abort_ack", opPing: "ping", opPong: "pong", opBye: "bye",
}

func opByName(name []byte) op {
	for o := opHello; o < opEnd; o++ {
		if string(name) == opNames[o] {
			return o
		}
	}
	return opUnknown
}

func opOf(f Frame) op {
	switch f.(type) {
	case *Hello:
		return opHello
	case *Welcome:
		return opWelcome
	case *Auth:
		return opAuth
	case *Ready:
		return opReady
	case *Refuse:
		return opRefuse
	case *Lookup:
		return opLookup
	case *LookupResp:
		return opLookupResp
	case *Fetch:
		return opFetch
	case *TransferDone:
		return opTransferDone
	case *Abort:
		return opAbort
	case *AbortAck:
		return opAbortAck
	case *Ping:
		return opPing
	case *Pong:
		return opPong
	case *Bye:
		return opBye
	}
	return opUnknown
}

// OpName is f's op on the wire ("hello", "lookup_resp", ...), for logs and
// counter labels; "" for nil.
func OpName(f Frame) string {
	if o := opOf(f); o != opUnknown {
		return opNames[o]
	}
	return ""
}

// field is a frame map key.
type field uint8

const (
	fV field = iota
	fOp
	fEpoch
	fNode
	fNonce
	fNS
	fBlockBytes
	fSlots
	fTransport
	fMeta
	fMAC
	fReason
	fMsg
	fRound
	fKeys
	fHits
	fCRC
	fProv
	fDest
	fToken
	fOK
	fSeq
	fTTL
	fSizes
	numFields
)

var fieldNames = [numFields]string{
	fV: "v", fOp: "op", fEpoch: "e", fNode: "node", fNonce: "nonce", fNS: "ns",
	fBlockBytes: "block_bytes", fSlots: "slots", fTransport: "transport",
	fMeta: "meta", fMAC: "mac", fReason: "reason", fMsg: "msg", fRound: "round",
	fKeys: "keys", fHits: "hits", fCRC: "crc", fProv: "prov", fDest: "dest",
	fToken: "token", fOK: "ok", fSeq: "seq", fTTL: "ttl", fSizes: "sizes",
}

var fieldByName = func() map[string]field {
	m := make(map[string]field, numFields)
	for f, name := range fieldNames {
		m[name] = field(f)
	}
	return m
}()

type fieldSet uint32

func (f field) bit() fieldSet { return 1 << f }

func set(fs ...field) fieldSet {
	var s fieldSet
	for _, f := range fs {
		s |= f.bit()
	}
	return s
}

// schema: the fields each op requires and those it may carry. Every other
// field is refused.
var schema = func() [opEnd]struct{ required, optional fieldSet } {
	common := set(fV, fOp, fEpoch)
	hello := common | set(fNode, fNonce, fBlockBytes, fSlots, fTransport)
	var s [opEnd]struct{ required, optional fieldSet }
	s[opHello].required, s[opHello].optional = hello, set(fNS, fMeta)
	s[opWelcome].required, s[opWelcome].optional = hello|set(fMAC), set(fNS, fMeta)
	s[opAuth].required = common | set(fMAC)
	s[opReady].required = common
	s[opRefuse].required, s[opRefuse].optional = common|set(fReason), set(fMsg)
	s[opLookup].required = common | set(fRound, fKeys)
	s[opLookupResp].required, s[opLookupResp].optional = common|set(fRound, fHits, fCRC), set(fProv, fSizes)
	s[opFetch].required, s[opFetch].optional = common|set(fRound, fKeys, fDest, fToken, fTTL), set(fSizes)
	s[opTransferDone].required, s[opTransferDone].optional = common|set(fRound, fOK), set(fReason)
	s[opAbort].required = common | set(fRound)
	s[opAbortAck].required = common | set(fRound)
	s[opPing].required = common | set(fSeq)
	s[opPong].required = common | set(fSeq)
	s[opBye].required, s[opBye].optional = common, set(fReason)
	return s
}()

// Decode decodes one frame. The frame is copied once: decoded byte slices
// (hashes, nonces, MACs, tokens, metadata, parent hashes) share that private
// copy and never alias b. Every error is an *Error (see Reason).
//
// A Hello or Welcome of another protocol version returns the frame — with
// only Version, Node and Epoch set — and an error wrapping ErrVersion, so the
// session can answer Refuse{Reason: RefuseVersion} naming the node. Every
// other error comes with a nil frame.
func Decode(b []byte) (Frame, error) {
	if len(b) > MaxFrameBytes {
		return nil, tooLarge("", "", "frame of %d bytes (max %d)", len(b), MaxFrameBytes)
	}
	if len(b) == 0 {
		return nil, malformed("", "", "empty frame")
	}
	d := decoder{r: reader{B: append(make([]byte, 0, len(b)), b...)}}
	return d.decode()
}

// values holds decoded fields until the frame is built.
type values struct {
	epoch, round, seq, ttl       uint64
	node, transport, reason, msg string
	nonce, meta, mac, token      []byte
	ns                           []string
	blockBytes, slots            int
	ok                           bool
	keys                         []Key
	hits                         []bool
	crc                          []uint32
	prov                         []*Provenance
	dest                         []int
	sizes                        []int
}

type decoder struct {
	r       reader
	version uint64
	op      op
	opName  string
	seen    fieldSet
	later   fieldSet       // fields met before the header was known, decoded in finish
	rawOp   string         // the op name as sent, when unknown
	offs    [numFields]int // where deferred fields start
	unknown string         // the first unknown field name, if any
	ready   bool           // v and op read, v == Version, op known: decode fields as met
	lastNS  string         // keys of one frame nearly always share a namespace
	tokens  []int32        // slab for provenance token ids
	v       values
}

func (d *decoder) decode() (Frame, error) {
	n, err := d.r.MapLen(maxFields)
	if err != nil {
		return nil, fieldErr("", "", err)
	}
	for range n {
		name, err := d.r.StrBytes(maxNameBytes)
		if err != nil {
			return nil, fieldErr(d.opName, "", err)
		}
		f, known := fieldByName[string(name)]
		switch {
		case !known && d.ready:
			return nil, malformed(d.opName, "", "unknown field %q", name)
		case !known:
			if d.unknown == "" {
				d.unknown = string(name)
			}
			if err := d.r.Skip(0); err != nil {
				return nil, fieldErr(d.opName, strconv.Quote(string(name)), err)
			}
			continue
		case d.seen&f.bit() != 0:
			return nil, malformed(d.opName, fieldNames[f], "field repeated")
		}
		d.seen |= f.bit()
		if err := d.field(f); err != nil {
			return nil, err
		}
	}
	if d.r.Left() != 0 {
		return nil, malformed(d.opName, "", "%d bytes after the frame map", d.r.Left())
	}
	return d.finish()
}

// field handles one known field: the header fields at once, the others at
// once when ready, else later (their offset is kept and the value skipped).
func (d *decoder) field(f field) error {
	switch f {
	case fV:
		v, err := d.r.Uint(versionMax)
		if err != nil {
			return fieldErr(d.opName, "v", err)
		}
		d.version = v
	case fOp:
		name, err := d.r.StrBytes(maxNameBytes)
		if err != nil {
			return fieldErr("", "op", err)
		}
		if d.op = opByName(name); d.op != opUnknown {
			d.opName = opNames[d.op]
		} else {
			d.rawOp = string(name)
		}
	default:
		if d.ready {
			if s := schema[d.op]; (s.required|s.optional)&f.bit() == 0 {
				return malformed(d.opName, "", "%s takes no field %q", d.opName, fieldNames[f])
			}
			return d.value(f)
		}
		d.offs[f] = d.r.Off
		d.later |= f.bit()
		if err := d.r.Skip(0); err != nil {
			return fieldErr(d.opName, fieldNames[f], err)
		}
		return nil
	}
	d.ready = d.seen&set(fV, fOp) == set(fV, fOp) && d.version == Version && d.op != opUnknown
	return nil
}

// finish checks the frame's shape once the whole map was read, decodes the
// deferred fields and builds the frame.
func (d *decoder) finish() (Frame, error) {
	switch {
	case d.seen&fV.bit() == 0:
		return nil, malformed(d.opName, "", "missing field \"v\" (protocol version)")
	case d.seen&fOp.bit() == 0:
		return nil, malformed("", "", "missing field \"op\"")
	case d.version != Version:
		return d.otherVersion()
	case d.op == opUnknown:
		return nil, &Error{Kind: ErrUnknownOp, Msg: fmt.Sprintf("unknown op %q", d.rawOp)}
	case d.unknown != "":
		return nil, malformed(d.opName, "", "unknown field %q", d.unknown)
	}
	s := schema[d.op]
	if extra := d.seen &^ (s.required | s.optional); extra != 0 {
		return nil, malformed(d.opName, "", "%s takes no field %q", d.opName, fieldNames[firstField(extra)])
	}
	if missing := s.required &^ d.seen; missing != 0 {
		return nil, malformed(d.opName, "", "missing field %q", fieldNames[firstField(missing)])
	}
	for f := fEpoch; f < numFields; f++ {
		if d.later&f.bit() == 0 {
			continue
		}
		d.r.Off = d.offs[f]
		if err := d.value(f); err != nil {
			return nil, err
		}
	}
	fr := d.build()
	if err := check(fr); err != nil {
		return nil, err
	}
	return fr, nil
}

func firstField(s fieldSet) field {
	for f := field(0); f < numFields; f++ {
		if s&f.bit() != 0 {
			return f
		}
	}
	return numFields
}

// otherVersion answers a frame whose "v" is not Version. Hello and Welcome
// keep "node" and "e" with their version-1 types in every version: those
// are decoded (every other field is skipped, known or not) so the session
// can refuse the node by name.
func (d *decoder) otherVersion() (Frame, error) {
	verr := &Error{Kind: ErrVersion, Op: d.opName,
		Msg: "protocol version " + utoa(d.version) + " (this node speaks " + utoa(Version) + ")"}
	if d.op != opHello && d.op != opWelcome {
		return nil, verr
	}
	for _, f := range []field{fNode, fEpoch} {
		if d.seen&f.bit() == 0 {
			return nil, malformed(d.opName, "", "missing field %q", fieldNames[f])
		}
		d.r.Off = d.offs[f]
		if err := d.value(f); err != nil {
			return nil, err
		}
	}
	if err := checkNode(d.v.node); err != nil {
		return nil, fieldErr(d.opName, "node", err)
	}
	if d.v.epoch == 0 {
		return nil, malformed(d.opName, "e", "epoch 0")
	}
	if d.op == opHello {
		return &Hello{Version: int(d.version), Node: d.v.node, Epoch: d.v.epoch}, verr
	}
	return &Welcome{Version: int(d.version), Node: d.v.node, Epoch: d.v.epoch}, verr
}

func utoa(v uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		if v /= 10; v == 0 {
			return string(b[i:])
		}
	}
}

// value decodes field f's value at the reader's offset, with its exact
// type and its bounds.
func (d *decoder) value(f field) error {
	r, v := &d.r, &d.v
	var err error
	var u uint64
	switch f {
	case fEpoch:
		v.epoch, err = r.Uint(math.MaxUint64)
	case fRound:
		v.round, err = r.Uint(math.MaxUint64)
	case fSeq:
		v.seq, err = r.Uint(math.MaxUint64)
	case fTTL:
		v.ttl, err = r.Uint(MaxFetchTTLms)
	case fNode:
		v.node, err = r.Str(MaxNodeIDBytes)
	case fTransport:
		v.transport, err = r.Str(MaxStringBytes)
	case fReason:
		v.reason, err = r.Str(MaxStringBytes)
	case fMsg:
		v.msg, err = r.Str(MaxStringBytes)
	case fNonce:
		v.nonce, err = r.BinExact(NonceBytes)
	case fMAC:
		v.mac, err = r.BinExact(MACBytes)
	case fToken:
		v.token, err = r.BinExact(TokenBytes)
	case fMeta:
		if v.meta, err = r.Bin(MaxMetaBytes); len(v.meta) == 0 {
			v.meta = nil
		}
	case fNS:
		v.ns, err = d.strings(MaxNamespaces, MaxStringBytes)
	case fBlockBytes:
		u, err = r.Uint(MaxBlockBytes)
		v.blockBytes = int(u)
	case fSlots:
		u, err = r.Uint(MaxSlots)
		v.slots = int(u)
	case fOK:
		v.ok, err = r.Bool()
	case fKeys:
		v.keys, err = d.keys()
	case fHits:
		v.hits, err = d.hits()
	case fCRC:
		v.crc, err = d.crcs()
	case fProv:
		v.prov, err = d.provs()
	case fDest:
		v.dest, err = d.dest()
	case fSizes:
		v.sizes, err = d.sizes()
	}
	if err != nil {
		return fieldErr(d.opName, fieldNames[f], err)
	}
	return nil
}

func (d *decoder) strings(maxN, maxLen int) ([]string, error) {
	n, err := d.r.ArrayLen(maxN, 1)
	if err != nil || n == 0 {
		return nil, err // empty as absent
	}
	out := make([]string, n)
	for i := range out {
		if out[i], err = d.r.Str(maxLen); err != nil {
			return nil, indexErr(i, err)
		}
	}
	return out, nil
}

// indexErr says which element of a list was wrong, keeping the error's
// class (fieldErr finds a boundError through it).
func indexErr(i int, err error) error { return &elemError{i, err} }

type elemError struct {
	i   int
	err error
}

func (e *elemError) Error() string { return "element " + utoa(uint64(e.i)) + ": " + e.err.Error() }
func (e *elemError) Unwrap() error { return e.err }

// keys reads an array of keys, each [namespace str, hash bin, group uint].
func (d *decoder) keys() ([]Key, error) {
	n, err := d.r.ArrayLen(MaxKeys, minKeyBytes)
	if err != nil {
		return nil, err
	}
	keys := make([]Key, n)
	for i := range keys {
		if err := d.key(&keys[i]); err != nil {
			return nil, indexErr(i, err)
		}
	}
	return keys, nil
}

func (d *decoder) key(k *Key) error {
	r := &d.r
	n, err := r.ArrayLen(math.MaxInt32, 1)
	if err != nil {
		return err
	}
	if n != 3 {
		return errKeyShape
	}
	ns, err := r.StrBytes(MaxStringBytes)
	if err != nil {
		return err
	}
	// NB: reuse the previous key's namespace string: no allocation per key.
	if string(ns) != d.lastNS {
		d.lastNS = string(ns)
	}
	k.Namespace = d.lastNS
	if k.Hash, err = r.Bin(maxHash); err != nil {
		return err
	}
	g, err := r.Uint(math.MaxUint32)
	k.Group = uint32(g)
	return err
}

var errKeyShape = errorString("a key is [namespace, hash, group]")

type errorString string

func (e errorString) Error() string { return string(e) }

// hits reads a bin of one byte per key, 0 (miss) or 1 (hit).
func (d *decoder) hits() ([]bool, error) {
	p, err := d.r.Bin(MaxKeys)
	if err != nil || len(p) == 0 {
		return nil, err
	}
	out := make([]bool, len(p))
	for i, c := range p {
		if c > 1 {
			return nil, &elemError{i, errorString("a hit is 0 or 1")}
		}
		out[i] = c == 1
	}
	return out, nil
}

// crcs reads a bin of 4 bytes per key, each a little-endian uint32.
func (d *decoder) crcs() ([]uint32, error) {
	p, err := d.r.Bin(4 * MaxKeys)
	if err != nil || len(p) == 0 {
		return nil, err
	}
	if len(p)%4 != 0 {
		return nil, errorString("length is not a multiple of 4")
	}
	out := make([]uint32, len(p)/4)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(p[4*i:])
	}
	return out, nil
}

// dest reads an array of slot indices.
func (d *decoder) dest() ([]int, error) {
	n, err := d.r.ArrayLen(MaxKeys, 1)
	if err != nil || n == 0 {
		return nil, err
	}
	out := make([]int, n)
	for i := range out {
		u, err := d.r.Uint(MaxSlots - 1)
		if err != nil {
			return nil, indexErr(i, err)
		}
		out[i] = int(u)
	}
	return out, nil
}

// sizes reads an array of block lengths, each 0..MaxBlockBytes (check says
// which may be 0: a LookupResp's misses).
func (d *decoder) sizes() ([]int, error) {
	n, err := d.r.ArrayLen(MaxKeys, 1)
	if err != nil || n == 0 {
		return nil, err // empty as absent
	}
	out := make([]int, n)
	for i := range out {
		u, err := d.r.Uint(MaxBlockBytes)
		if err != nil {
			return nil, indexErr(i, err)
		}
		out[i] = int(u)
	}
	return out, nil
}

// provs reads an array of provenance maps or nils.
func (d *decoder) provs() ([]*Provenance, error) {
	n, err := d.r.ArrayLen(MaxKeys, 1)
	if err != nil || n == 0 {
		return nil, err
	}
	out := make([]*Provenance, n)
	var slab []Provenance
	for i := range out {
		if d.r.IsNil() {
			continue
		}
		// NB: provenances come from slabs, never more than the entries left.
		if len(slab) == 0 {
			slab = make([]Provenance, min(n-i, 256))
		}
		p := &slab[0]
		slab = slab[1:]
		if err = d.provenance(p); err != nil {
			return nil, indexErr(i, err)
		}
		out[i] = p
	}
	return out, nil
}

// int32s takes n int32s from the decoder's slab (capacity clipped). A new
// slab is never larger than what is left of the frame could fill.
func (d *decoder) int32s(n int) []int32 {
	if len(d.tokens) < n {
		d.tokens = make([]int32, max(n, min(4096, n+d.r.Left()/4)))
	}
	out := d.tokens[:n:n]
	d.tokens = d.tokens[n:]
	return out
}

const (
	pParent = 1 << iota
	pTokens
	pBlockSize
	pLoRAID
	pLoRAName
	pExtra
)

var provFields = map[string]int{
	"parent": pParent, "tokens": pTokens, "block_size": pBlockSize,
	"lora_id": pLoRAID, "lora_name": pLoRAName, "extra": pExtra,
}

func (d *decoder) provenance(p *Provenance) error {
	r := &d.r
	n, err := r.MapLen(maxFields)
	if err != nil {
		return err
	}
	seen := 0
	for range n {
		name, err := r.StrBytes(maxNameBytes)
		if err != nil {
			return err
		}
		f, ok := provFields[string(name)]
		switch {
		case !ok:
			return fmt.Errorf("unknown provenance field %q", name)
		case seen&f != 0:
			return fmt.Errorf("provenance field %q repeated", name)
		}
		seen |= f
		if err := d.provField(p, f); err != nil {
			return prefixed{string(name), err}
		}
	}
	return nil
}

func (d *decoder) provField(p *Provenance, f int) error {
	r := &d.r
	var err error
	switch f {
	case pParent:
		if r.IsNil() {
			return nil
		}
		if p.ParentHash, err = r.Bin(maxHash); len(p.ParentHash) == 0 {
			p.ParentHash = nil
		}
	case pTokens:
		var b []byte
		if b, err = r.Bin(4 * MaxTokenIDs); err != nil || len(b) == 0 {
			return err
		}
		if len(b)%4 != 0 {
			return errorString("length is not a multiple of 4")
		}
		p.TokenIDs = d.int32s(len(b) / 4)
		for i := range p.TokenIDs {
			p.TokenIDs[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case pBlockSize:
		var u uint64
		u, err = r.Uint(MaxTokenIDs)
		p.BlockSize = int(u)
	case pLoRAID:
		var i int64
		i, err = r.Int(math.MinInt32, math.MaxInt32)
		p.LoRAID = int(i)
	case pLoRAName:
		p.LoRAName, err = r.Str(MaxStringBytes)
	case pExtra:
		p.ExtraKeys, err = d.strings(MaxExtraKeys, MaxStringBytes)
	}
	return err
}

// prefixed names the sub-field an error is about, keeping its class.
type prefixed struct {
	name string
	err  error
}

func (p prefixed) Error() string { return p.name + ": " + p.err.Error() }
func (p prefixed) Unwrap() error { return p.err }

// build makes the frame of d.op from the decoded values.
func (d *decoder) build() Frame {
	v := &d.v
	switch d.op {
	case opHello:
		return &Hello{Version: Version, Node: v.node, Epoch: v.epoch, Nonce: v.nonce,
			Namespaces: v.ns, BlockBytes: v.blockBytes, Slots: v.slots,
			Transport: v.transport, DataMeta: v.meta}
	case opWelcome:
		return &Welcome{Version: Version, Node: v.node, Epoch: v.epoch, Nonce: v.nonce,
			Namespaces: v.ns, BlockBytes: v.blockBytes, Slots: v.slots,
			Transport: v.transport, DataMeta: v.meta, MAC: v.mac}
	case opAuth:
		return &Auth{Epoch: v.epoch, MAC: v.mac}
	case opReady:
		return &Ready{Epoch: v.epoch}
	case opRefuse:
		return &Refuse{Epoch: v.epoch, Reason: v.reason, Msg: v.msg}
	case opLookup:
		return &Lookup{Epoch: v.epoch, Round: v.round, Keys: v.keys}
	case opLookupResp:
		return &LookupResp{Epoch: v.epoch, Round: v.round, Hits: v.hits, Checksums: v.crc, Prov: v.prov, Sizes: v.sizes}
	case opFetch:
		return &Fetch{Epoch: v.epoch, Round: v.round, Keys: v.keys, Dest: v.dest, Sizes: v.sizes, Token: v.token, TTLms: uint32(v.ttl)}
	case opTransferDone:
		return &TransferDone{Epoch: v.epoch, Round: v.round, OK: v.ok, Reason: v.reason}
	case opAbort:
		return &Abort{Epoch: v.epoch, Round: v.round}
	case opAbortAck:
		return &AbortAck{Epoch: v.epoch, Round: v.round}
	case opPing:
		return &Ping{Epoch: v.epoch, Seq: v.seq}
	case opPong:
		return &Pong{Epoch: v.epoch, Seq: v.seq}
	}
	return &Bye{Epoch: v.epoch, Reason: v.reason}
}
