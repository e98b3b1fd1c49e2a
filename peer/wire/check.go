package wire

import (
	"math"
	"reflect"
	"unicode"
	"unicode/utf8"

	"github.com/kvtier/kvtier/internal/msgp"
	"github.com/kvtier/kvtier/messages"
)

const maxHash = messages.MaxHashBytes

// check reports whether f is a frame this version may send: every bound,
// exact length and consistency rule of docs/PROTOCOL.md ("Peer protocol").
// Encode runs it before writing and Decode after reading, so whatever
// decodes re-encodes. Its errors are *Error without Op (the caller adds it).
func check(f Frame) error {
	// NB: every frame type is a pointer (Frame's method has pointer
	// receivers), so one test refuses nil, typed or not, for all of them.
	if f == nil || reflect.ValueOf(f).IsNil() {
		return nilFrame()
	}
	var err error
	switch f := f.(type) {
	case *Hello:
		err = checkHalf(f.Version, f.Node, f.Epoch, f.Nonce, f.Namespaces, f.BlockBytes, f.Slots, f.Transport, f.DataMeta)
	case *Welcome:
		err = first(checkHalf(f.Version, f.Node, f.Epoch, f.Nonce, f.Namespaces, f.BlockBytes, f.Slots, f.Transport, f.DataMeta),
			checkExact("mac", f.MAC, MACBytes))
	case *Auth:
		err = first(checkEpoch(f.Epoch), checkExact("mac", f.MAC, MACBytes))
	case *Ready:
		err = checkEpoch(f.Epoch)
	case *Refuse:
		err = first(checkEpoch(f.Epoch), checkString("reason", f.Reason, 1), checkString("msg", f.Msg, 0))
	case *Lookup:
		err = first(checkEpoch(f.Epoch), checkRound(f.Round), checkKeys(f.Keys))
	case *LookupResp:
		err = first(checkEpoch(f.Epoch), checkRound(f.Round), checkResp(f))
	case *Fetch:
		err = first(checkEpoch(f.Epoch), checkRound(f.Round), checkKeys(f.Keys),
			checkDest(f.Dest, len(f.Keys)), checkFetchSizes(f.Sizes, len(f.Keys)), checkExact("token", f.Token, TokenBytes),
			checkRange("ttl", int(f.TTLms), 1, MaxFetchTTLms))
	case *TransferDone:
		err = first(checkEpoch(f.Epoch), checkRound(f.Round), checkString("reason", f.Reason, 0))
	case *Abort:
		err = first(checkEpoch(f.Epoch), checkRound(f.Round))
	case *AbortAck:
		err = first(checkEpoch(f.Epoch), checkRound(f.Round))
	case *Ping:
		err = checkEpoch(f.Epoch)
	case *Pong:
		err = checkEpoch(f.Epoch)
	case *Bye:
		err = first(checkEpoch(f.Epoch), checkString("reason", f.Reason, 0))
	default:
		return nilFrame()
	}
	if err != nil {
		err.(*Error).Op = OpName(f)
		return err
	}
	return nil
}

func nilFrame() error { return &Error{Kind: ErrMalformed, Msg: "nil frame"} }

// first is the first non-nil error, evaluated eagerly (checks are cheap).
func first(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func checkHalf(version int, node string, epoch uint64, nonce []byte, ns []string,
	blockBytes, slots int, transport string, meta []byte) error {
	if version != Version {
		return &Error{Kind: ErrVersion, Field: "v", Msg: "version " + itoa(version) + " (this node speaks " + itoa(Version) + ")"}
	}
	if err := checkNode(node); err != nil {
		return fieldErr("", "node", err)
	}
	if err := checkName(transport, MaxStringBytes); err != nil {
		return fieldErr("", "transport", err)
	}
	return first(checkEpoch(epoch), checkExact("nonce", nonce, NonceBytes), checkNamespaces(ns),
		checkRange("block_bytes", blockBytes, 1, MaxBlockBytes), checkRange("slots", slots, 1, MaxSlots),
		checkBytes("meta", meta, MaxMetaBytes))
}

// checkNode: a node id is 1..MaxNodeIDBytes of printable UTF-8 without
// spaces (it is a ZeroMQ identity, and it appears in logs).
func checkNode(s string) error { return checkName(s, MaxNodeIDBytes) }

func checkName(s string, max int) error {
	switch {
	case len(s) == 0:
		return errorString("empty")
	case len(s) > max:
		return msgp.OverBound("%d bytes (max %d)", len(s), max)
	case !utf8.ValidString(s):
		return errorString("not UTF-8")
	}
	for _, c := range s {
		if c == ' ' || !unicode.IsPrint(c) {
			return errorString("holds a space or a non-printable character")
		}
	}
	return nil
}

func checkEpoch(e uint64) error {
	if e == 0 {
		return &Error{Kind: ErrMalformed, Field: "e", Msg: "epoch 0"}
	}
	return nil
}

func checkRound(r uint64) error {
	if r == 0 {
		return &Error{Kind: ErrMalformed, Field: "round", Msg: "round 0"}
	}
	return nil
}

func checkExact(field string, p []byte, n int) error {
	if len(p) != n {
		return malformed("", field, "%d bytes (want exactly %d)", len(p), n)
	}
	return nil
}

func checkBytes(field string, p []byte, max int) error {
	if len(p) > max {
		return tooLarge("", field, "%d bytes (max %d)", len(p), max)
	}
	return nil
}

func checkString(field, s string, min int) error {
	switch {
	case len(s) < min:
		return malformed("", field, "empty")
	case len(s) > MaxStringBytes:
		return tooLarge("", field, "%d bytes (max %d)", len(s), MaxStringBytes)
	}
	return nil
}

func checkRange(field string, v, min, max int) error {
	switch {
	case v < 0 || v < min:
		return malformed("", field, "%d (want %d..%d)", v, min, max)
	case v > max:
		return tooLarge("", field, "%d (want %d..%d)", v, min, max)
	}
	return nil
}

func checkNamespaces(ns []string) error {
	if len(ns) > MaxNamespaces {
		return tooLarge("", "ns", "%d namespaces (max %d)", len(ns), MaxNamespaces)
	}
	for i, s := range ns {
		if len(s) > MaxStringBytes {
			return tooLarge("", "ns", "namespace %d: %d bytes (max %d)", i, len(s), MaxStringBytes)
		}
		for _, t := range ns[:i] {
			if t == s {
				return malformed("", "ns", "namespace %q repeated", s)
			}
		}
	}
	return nil
}

func checkKeys(keys []Key) error {
	switch {
	case len(keys) == 0:
		return malformed("", "keys", "no keys")
	case len(keys) > MaxKeys:
		return tooLarge("", "keys", "%d keys (max %d)", len(keys), MaxKeys)
	}
	for i := range keys {
		k := &keys[i]
		switch {
		case len(k.Namespace) > MaxStringBytes:
			return tooLarge("", "keys", "key %d: namespace of %d bytes (max %d)", i, len(k.Namespace), MaxStringBytes)
		case len(k.Hash) == 0:
			return malformed("", "keys", "key %d: empty hash", i)
		case len(k.Hash) > maxHash:
			return tooLarge("", "keys", "key %d: hash of %d bytes (max %d)", i, len(k.Hash), maxHash)
		}
	}
	return nil
}

func checkDest(dest []int, keys int) error {
	if len(dest) != keys {
		return malformed("", "dest", "%d slots for %d keys", len(dest), keys)
	}
	for i, s := range dest {
		if err := checkRange("dest", s, 0, MaxSlots-1); err != nil {
			err.(*Error).Msg = "slot " + itoa(i) + ": " + err.(*Error).Msg
			return err
		}
	}
	return nil
}

// checkSize: a hit's length is 1..MaxBlockBytes, a miss's 0.
func checkSize(i, n int, hit bool) error {
	switch {
	case !hit && n != 0:
		return malformed("", "sizes", "entry %d: a miss of %d bytes", i, n)
	case !hit:
		return nil
	}
	if err := checkRange("sizes", n, 1, MaxBlockBytes); err != nil {
		err.(*Error).Msg = "entry " + itoa(i) + ": " + err.(*Error).Msg
		return err
	}
	return nil
}

// checkFetchSizes: absent, or one length of 1..MaxBlockBytes per key.
func checkFetchSizes(sizes []int, keys int) error {
	if len(sizes) == 0 {
		return nil
	}
	if len(sizes) != keys {
		return malformed("", "sizes", "%d sizes for %d keys", len(sizes), keys)
	}
	for i, n := range sizes {
		if err := checkSize(i, n, true); err != nil {
			return err
		}
	}
	return nil
}

func checkResp(f *LookupResp) error {
	n := len(f.Hits)
	switch {
	case n == 0:
		return malformed("", "hits", "no entries")
	case n > MaxKeys:
		return tooLarge("", "hits", "%d entries (max %d)", n, MaxKeys)
	case len(f.Checksums) != n:
		return malformed("", "crc", "%d checksums for %d entries", len(f.Checksums), n)
	case len(f.Prov) != 0 && len(f.Prov) != n:
		return malformed("", "prov", "%d provenances for %d entries", len(f.Prov), n)
	case len(f.Sizes) != 0 && len(f.Sizes) != n:
		return malformed("", "sizes", "%d sizes for %d entries", len(f.Sizes), n)
	}
	for i, hit := range f.Hits {
		if !hit && f.Checksums[i] != 0 {
			return malformed("", "crc", "entry %d: a miss with checksum %d", i, f.Checksums[i])
		}
		if len(f.Sizes) != 0 {
			if err := checkSize(i, f.Sizes[i], hit); err != nil {
				return err
			}
		}
		if len(f.Prov) == 0 || f.Prov[i] == nil {
			continue
		}
		if !hit {
			return malformed("", "prov", "entry %d: a miss with provenance", i)
		}
		if err := checkProv(f.Prov[i]); err != nil {
			e := err.(*Error)
			e.Field, e.Msg = "prov."+e.Field, "entry "+itoa(i)+": "+e.Msg
			return e
		}
	}
	return nil
}

func checkProv(p *Provenance) error {
	if len(p.ParentHash) > maxHash {
		return tooLarge("", "parent", "%d bytes (max %d)", len(p.ParentHash), maxHash)
	}
	if len(p.TokenIDs) > MaxTokenIDs {
		return tooLarge("", "tokens", "%d token ids (max %d)", len(p.TokenIDs), MaxTokenIDs)
	}
	if p.LoRAID < math.MinInt32 || p.LoRAID > math.MaxInt32 {
		return tooLarge("", "lora_id", "%d is not an int32", p.LoRAID)
	}
	if len(p.ExtraKeys) > MaxExtraKeys {
		return tooLarge("", "extra", "%d extra keys (max %d)", len(p.ExtraKeys), MaxExtraKeys)
	}
	for i, s := range p.ExtraKeys {
		if len(s) > MaxStringBytes {
			return tooLarge("", "extra", "extra key %d: %d bytes (max %d)", i, len(s), MaxStringBytes)
		}
	}
	return first(checkRange("block_size", p.BlockSize, 0, MaxTokenIDs), checkString("lora_name", p.LoRAName, 0))
}

func itoa(v int) string {
	if v < 0 {
		return "-" + utoa(uint64(-int64(v)))
	}
	return utoa(uint64(v))
}
