package events

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvtier/kvtier/internal/msgp"
)

// Event types, vLLM's tag values.
const (
	TypeBlockStored      = "BlockStored"
	TypeBlockRemoved     = "BlockRemoved"
	TypeAllBlocksCleared = "AllBlocksCleared"
)

// HashFormat is how block hashes are written on the wire.
type HashFormat uint8

const (
	// HashInt writes the low 64 bits of the hash (its last 8 bytes, big
	// endian) as an unsigned int: vLLM's default
	// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1).
	HashInt HashFormat = iota
	// HashBytes writes the raw hash bytes as msgpack bin.
	HashBytes
)

// hashFormatNames spells each HashFormat, the default first.
var hashFormatNames = []string{HashInt: "int", HashBytes: "bytes"}

// ParseHashFormat parses "int" (or "") and "bytes".
func ParseHashFormat(s string) (HashFormat, error) {
	return parseSetting[HashFormat]("hash format", s, hashFormatNames)
}

func (f HashFormat) String() string {
	if f == HashBytes {
		return "bytes"
	}
	return "int"
}

// parseSetting reads s as one of an enumerated setting's names, where
// names[i] spells the setting's value i and "" is the first (the default).
// The events settings parse through it so that a bad value of any of them
// is refused the same way: ErrBadConfig naming what it is and the names
// that would do.
func parseSetting[T ~uint8 | ~int](what, s string, names []string) (T, error) {
	if s == "" {
		return 0, nil
	}
	if i := slices.Index(names, s); i >= 0 {
		return T(i), nil
	}
	return 0, fmt.Errorf("%w: %s %q (want %s)", ErrBadConfig, what, s, strings.Join(names, " or "))
}

// Hash is a block hash as it is on the wire: an unsigned int or raw bytes.
type Hash struct {
	Int     uint64 // the value when !IsBytes
	Bytes   []byte // the value when IsBytes
	IsBytes bool
}

// WireHash renders a raw block hash in format f.
func WireHash(raw string, f HashFormat) Hash {
	if f == HashBytes {
		return Hash{Bytes: []byte(raw), IsBytes: true}
	}
	var low [8]byte
	n := min(len(raw), 8)
	copy(low[8-n:], raw[len(raw)-n:])
	return Hash{Int: binary.BigEndian.Uint64(low[:])}
}

// String is the decimal int or the hex bytes.
func (h Hash) String() string {
	if h.IsBytes {
		return hex.EncodeToString(h.Bytes)
	}
	return strconv.FormatUint(h.Int, 10)
}

// MarshalJSON writes an int hash as a JSON number and a bytes hash as a
// hex string.
func (h Hash) MarshalJSON() ([]byte, error) {
	if h.IsBytes {
		return json.Marshal(hex.EncodeToString(h.Bytes))
	}
	return []byte(strconv.FormatUint(h.Int, 10)), nil
}

// Equal reports whether two hashes are the same value in the same form.
func (h Hash) Equal(o Hash) bool {
	if h.IsBytes != o.IsBytes {
		return false
	}
	if h.IsBytes {
		return bytes.Equal(h.Bytes, o.Bytes)
	}
	return h.Int == o.Int
}

// Event is one KV event as published, with vLLM's field names. Optional
// fields are written only when set (see docs/PROTOCOL.md).
type Event struct {
	Type        string     `json:"type"`                                   // TypeBlockStored, TypeBlockRemoved or TypeAllBlocksCleared
	BlockHashes []Hash     `json:"block_hashes,omitempty"`                 // stored: in chain order; removed: any order
	Parent      *Hash      `json:"parent_block_hash,omitempty"`            // stored: parent of BlockHashes[0]; nil = none
	TokenIDs    []int32    `json:"token_ids,omitempty"`                    // stored: BlockSize tokens per block, concatenated
	BlockSize   int        `json:"block_size,omitempty"`                   // stored: tokens per block
	LoRAID      *int64     `json:"lora_id,omitempty"`                      // stored: nil = none
	Medium      string     `json:"medium,omitempty"`                       // "CPU" or "STORAGE"; "" = None
	LoRAName    string     `json:"lora_name,omitempty"`                    // stored: "" = None
	ExtraKeys   [][]string `json:"extra_keys,omitempty"`                   // stored: one entry per block; nil = omitted
	GroupIdx    *uint32    `json:"group_idx,omitempty"`                    // KV-cache group; nil = omitted
	SpecKind    string     `json:"kv_cache_spec_kind,omitempty"`           // stored: the group's KV-cache spec kind (vLLM 0.33); "" = omitted
	Window      *int64     `json:"kv_cache_spec_sliding_window,omitempty"` // stored: the group's sliding window; nil = omitted
	Locality    string     `json:"locality,omitempty"`                     // "LOCAL" / "REMOTE"; "" = omitted
	Ownership   string     `json:"ownership,omitempty"`                    // secondary tier id; "" = omitted
	SessionID   string     `json:"session_id,omitempty"`                   // stored: the session of the request that stored it; "" = omitted
}

// Batch is one published message's payload.
type Batch struct {
	TS        float64 `json:"ts"`     // seconds since the Unix epoch
	Events    []Event `json:"events"` // in the order they happened
	DPRank    int64   `json:"data_parallel_rank"`
	HasDPRank bool    `json:"-"` // false for legacy two-element batches
}

// Encoding is how events are written inside a batch.
type Encoding int

const (
	// EncodingMap writes each event as a map tagged by "type" (vLLM since PR
	// #42892; the default).
	EncodingMap Encoding = iota
	// EncodingArray writes each event as vLLM's legacy positional array:
	// [type, block_hashes, parent_block_hash, token_ids, block_size, lora_id,
	// medium] for a store, [type, block_hashes, medium] for a removal,
	// [type] for a clear. The fields the legacy form did not have (LoRA
	// name, extra keys, group, spec kind, locality, ownership, session) are
	// left out, for routers that read arrays only.
	EncodingArray
)

// encodingNames spells each Encoding, the default first.
var encodingNames = []string{EncodingMap: "map", EncodingArray: "array"}

// ParseEncoding reads "map" or "array" ("" is map).
func ParseEncoding(s string) (Encoding, error) {
	return parseSetting[Encoding]("encoding", s, encodingNames)
}

// EncodeBatch writes b as msgpack: the array [ts, events, data_parallel_rank]
// with each event a map tagged by "type".
func EncodeBatch(b *Batch) ([]byte, error) { return EncodeBatchAs(b, EncodingMap) }

// EncodeBatchAs writes b with its events in the given encoding.
func EncodeBatchAs(b *Batch, e Encoding) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	w := writer{enc: enc}
	w.arrayLen(3)
	w.float(b.TS)
	w.arrayLen(len(b.Events))
	for i := range b.Events {
		if e == EncodingArray {
			w.legacyEvent(&b.Events[i])
		} else {
			w.event(&b.Events[i])
		}
	}
	w.int(b.DPRank)
	if w.err != nil {
		return nil, fmt.Errorf("events: encode batch: %w", w.err)
	}
	return buf.Bytes(), nil
}

// writer sticks at the first error so the encoder reads straight.
type writer struct {
	enc *msgpack.Encoder
	err error
}

func (w *writer) do(f func() error) {
	if w.err == nil {
		w.err = f()
	}
}
func (w *writer) arrayLen(n int)  { w.do(func() error { return w.enc.EncodeArrayLen(n) }) }
func (w *writer) mapLen(n int)    { w.do(func() error { return w.enc.EncodeMapLen(n) }) }
func (w *writer) str(s string)    { w.do(func() error { return w.enc.EncodeString(s) }) }
func (w *writer) int(v int64)     { w.do(func() error { return w.enc.EncodeInt(v) }) }
func (w *writer) uint(v uint64)   { w.do(func() error { return w.enc.EncodeUint(v) }) }
func (w *writer) float(v float64) { w.do(func() error { return w.enc.EncodeFloat64(v) }) }
func (w *writer) nil_()           { w.do(w.enc.EncodeNil) }

func (w *writer) optStr(s string) {
	if s == "" {
		w.nil_()
		return
	}
	w.str(s)
}

func (w *writer) hash(h Hash) {
	if h.IsBytes {
		w.do(func() error { return w.enc.EncodeBytes(h.Bytes) })
		return
	}
	w.uint(h.Int)
}

func (w *writer) hashes(hs []Hash) {
	w.arrayLen(len(hs))
	for _, h := range hs {
		w.hash(h)
	}
}

func (w *writer) tokens(ids []int32) {
	w.arrayLen(len(ids))
	for _, t := range ids {
		w.int(int64(t))
	}
}

// optional writes *p with write, or nil when p is nil: the fields vLLM
// always sends, as None when unset (a parent hash, a LoRA id).
func optional[T any](w *writer, p *T, write func(T)) {
	if p == nil {
		w.nil_()
		return
	}
	write(*p)
}

// event writes one event map. Fields in vLLM's declaration order; the ones
// without a default in vLLM are always present (nil when unset), the rest
// only when set.
func (w *writer) event(e *Event) {
	n := 1
	switch e.Type {
	case TypeBlockStored:
		n = 8 + msgp.Count(e.ExtraKeys != nil, e.GroupIdx != nil, e.SpecKind != "", e.Window != nil,
			e.Locality != "", e.Ownership != "", e.SessionID != "")
	case TypeBlockRemoved:
		n = 3 + msgp.Count(e.GroupIdx != nil, e.Locality != "", e.Ownership != "")
	}
	w.mapLen(n)
	w.str("type")
	w.str(e.Type)
	switch e.Type {
	case TypeBlockStored:
		w.str("block_hashes")
		w.hashes(e.BlockHashes)
		w.str("parent_block_hash")
		optional(w, e.Parent, w.hash)
		w.str("token_ids")
		w.tokens(e.TokenIDs)
		w.str("block_size")
		w.int(int64(e.BlockSize))
		w.str("lora_id")
		optional(w, e.LoRAID, w.int)
		w.str("medium")
		w.optStr(e.Medium)
		w.str("lora_name")
		w.optStr(e.LoRAName)
		if e.ExtraKeys != nil {
			w.str("extra_keys")
			w.arrayLen(len(e.ExtraKeys))
			for _, ks := range e.ExtraKeys {
				if ks == nil {
					w.nil_()
					continue
				}
				w.arrayLen(len(ks))
				for _, k := range ks {
					w.str(k)
				}
			}
		}
		w.group(e)
		if e.SpecKind != "" {
			w.str("kv_cache_spec_kind")
			w.str(e.SpecKind)
		}
		if e.Window != nil {
			w.str("kv_cache_spec_sliding_window")
			w.int(*e.Window)
		}
		w.where(e)
		if e.SessionID != "" {
			w.str("session_id")
			w.str(e.SessionID)
		}
	case TypeBlockRemoved:
		w.str("block_hashes")
		w.hashes(e.BlockHashes)
		w.str("medium")
		w.optStr(e.Medium)
		w.group(e)
		w.where(e)
	}
}

// legacyEvent writes one event as vLLM's legacy positional array.
func (w *writer) legacyEvent(e *Event) {
	switch e.Type {
	case TypeBlockStored:
		w.arrayLen(7)
		w.str(e.Type)
		w.hashes(e.BlockHashes)
		optional(w, e.Parent, w.hash)
		w.tokens(e.TokenIDs)
		w.int(int64(e.BlockSize))
		optional(w, e.LoRAID, w.int)
		w.optStr(e.Medium)
	case TypeBlockRemoved:
		w.arrayLen(3)
		w.str(e.Type)
		w.hashes(e.BlockHashes)
		w.optStr(e.Medium)
	default:
		w.arrayLen(1)
		w.str(e.Type)
	}
}

// group writes the optional group_idx stored and removed events share.
func (w *writer) group(e *Event) {
	if e.GroupIdx != nil {
		w.str("group_idx")
		w.uint(uint64(*e.GroupIdx))
	}
}

// where writes the optional locality and ownership both events share.
func (w *writer) where(e *Event) {
	if e.Locality != "" {
		w.str("locality")
		w.str(e.Locality)
	}
	if e.Ownership != "" {
		w.str("ownership")
		w.str(e.Ownership)
	}
}

// Timestamp is t as the wire's ts: float seconds since the Unix epoch.
func Timestamp(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
