package wire

import (
	"encoding/binary"

	"github.com/kvtier/kvtier/internal/msgp"
)

// Encode encodes f as one frame of protocol Version: a msgpack map (see
// docs/PROTOCOL.md, "Peer protocol"). It refuses, with an *Error, a frame
// that Decode would refuse: a bound, exact length or consistency rule
// broken, a Hello or Welcome whose Version is not Version, a nil frame.
func Encode(f Frame) ([]byte, error) {
	if err := check(f); err != nil {
		return nil, err
	}
	w := writer{B: make([]byte, 0, sizeHint(f))}
	encode(&w, f)
	if len(w.B) > MaxFrameBytes {
		return nil, tooLarge(OpName(f), "", "frame of %d bytes (max %d)", len(w.B), MaxFrameBytes)
	}
	return w.B, nil
}

// encode writes f without checking it (tests use it to build frames that
// break the rules).
func encode(w *writer, f Frame) {
	switch f := f.(type) {
	case *Hello:
		encodeHalf(w, opHello, f.Node, f.Epoch, f.Nonce, f.Namespaces, f.BlockBytes, f.Slots, f.Transport, f.DataMeta, nil)
	case *Welcome:
		encodeHalf(w, opWelcome, f.Node, f.Epoch, f.Nonce, f.Namespaces, f.BlockBytes, f.Slots, f.Transport, f.DataMeta, f.MAC)
	case *Auth:
		header(w, 4, opAuth, f.Epoch)
		w.Str("mac")
		w.Bin(f.MAC)
	case *Ready:
		header(w, 3, opReady, f.Epoch)
	case *Refuse:
		header(w, 4+msgp.Count(f.Msg != ""), opRefuse, f.Epoch)
		w.Str("reason")
		w.Str(f.Reason)
		w.OptStr("msg", f.Msg)
	case *Lookup:
		header(w, 5, opLookup, f.Epoch)
		round(w, f.Round)
		encodeKeys(w, f.Keys)
	case *LookupResp:
		encodeResp(w, f)
	case *Fetch:
		header(w, 8+msgp.Count(len(f.Sizes) > 0), opFetch, f.Epoch)
		round(w, f.Round)
		encodeKeys(w, f.Keys)
		w.Str("dest")
		encodeUints(w, f.Dest)
		if len(f.Sizes) > 0 {
			w.Str("sizes")
			encodeUints(w, f.Sizes)
		}
		w.Str("token")
		w.Bin(f.Token)
		w.Str("ttl")
		w.Uint(uint64(f.TTLms))
	case *TransferDone:
		header(w, 5+msgp.Count(f.Reason != ""), opTransferDone, f.Epoch)
		round(w, f.Round)
		w.Str("ok")
		w.Bool(f.OK)
		w.OptStr("reason", f.Reason)
	case *Abort:
		encodeUintFrame(w, opAbort, f.Epoch, "round", f.Round)
	case *AbortAck:
		encodeUintFrame(w, opAbortAck, f.Epoch, "round", f.Round)
	case *Ping:
		encodeUintFrame(w, opPing, f.Epoch, "seq", f.Seq)
	case *Pong:
		encodeUintFrame(w, opPong, f.Epoch, "seq", f.Seq)
	case *Bye:
		header(w, 3+msgp.Count(f.Reason != ""), opBye, f.Epoch)
		w.OptStr("reason", f.Reason)
	}
}

// encodeUintFrame writes a frame whose only field beyond the header is one
// uint: an Abort's or AbortAck's round, a Ping's or Pong's seq.
func encodeUintFrame(w *writer, o op, epoch uint64, name string, v uint64) {
	header(w, 4, o, epoch)
	w.Str(name)
	w.Uint(v)
}

// encodeUints writes an array of non-negative ints (checked by check).
func encodeUints(w *writer, vs []int) {
	w.ArrayLen(len(vs))
	for _, v := range vs {
		w.Uint(uint64(v))
	}
}

// header writes the map header and the fields every frame has: v, op, e.
func header(w *writer, fields int, o op, epoch uint64) {
	w.MapLen(fields)
	w.Str("v")
	w.Uint(Version)
	w.Str("op")
	w.Str(opNames[o])
	w.Str("e")
	w.Uint(epoch)
}

func round(w *writer, r uint64) {
	w.Str("round")
	w.Uint(r)
}

func encodeHalf(w *writer, o op, node string, epoch uint64, nonce []byte, ns []string,
	blockBytes, slots int, transport string, meta, mac []byte) {
	header(w, 8+msgp.Count(len(ns) > 0, len(meta) > 0, o == opWelcome), o, epoch)
	w.Str("node")
	w.Str(node)
	w.Str("nonce")
	w.Bin(nonce)
	w.OptStrs("ns", ns)
	w.Str("block_bytes")
	w.Uint(uint64(blockBytes))
	w.Str("slots")
	w.Uint(uint64(slots))
	w.Str("transport")
	w.Str(transport)
	w.OptBin("meta", meta)
	if o == opWelcome {
		w.Str("mac")
		w.Bin(mac)
	}
}

// encodeKeys writes keys as an array of [namespace str, hash bin, group uint].
func encodeKeys(w *writer, keys []Key) {
	w.Str("keys")
	w.ArrayLen(len(keys))
	for i := range keys {
		k := &keys[i]
		w.B = append(w.B, 0x93)
		w.Str(k.Namespace)
		w.Bin(k.Hash)
		w.Uint(uint64(k.Group))
	}
}

func encodeResp(w *writer, f *LookupResp) {
	header(w, 6+msgp.Count(len(f.Prov) > 0, len(f.Sizes) > 0), opLookupResp, f.Epoch)
	round(w, f.Round)
	w.Str("hits")
	w.BinHeader(len(f.Hits))
	for _, h := range f.Hits {
		w.B = append(w.B, byte(msgp.Count(h)))
	}
	w.Str("crc")
	w.BinHeader(4 * len(f.Checksums))
	for _, c := range f.Checksums {
		w.B = binary.LittleEndian.AppendUint32(w.B, c)
	}
	if len(f.Sizes) > 0 {
		w.Str("sizes")
		encodeUints(w, f.Sizes)
	}
	if len(f.Prov) == 0 {
		return
	}
	w.Str("prov")
	w.ArrayLen(len(f.Prov))
	for _, p := range f.Prov {
		encodeProv(w, p)
	}
}

// encodeProv writes p as a map of its non-zero fields, nil as msgpack nil.
func encodeProv(w *writer, p *Provenance) {
	if p == nil {
		w.Nil()
		return
	}
	rest := msgp.Prov{Tokens: p.TokenIDs, BlockSize: p.BlockSize, LoRAID: p.LoRAID, LoRAName: p.LoRAName, Extra: p.ExtraKeys}
	w.MapLen(msgp.Count(len(p.ParentHash) > 0) + rest.Fields())
	w.OptBin("parent", p.ParentHash)
	w.WriteProv(&rest)
}

// sizeHint estimates f's encoded size, so Encode allocates once.
func sizeHint(f Frame) int {
	const base = 96
	switch f := f.(type) {
	case *Hello:
		return base + 256 + len(f.DataMeta) + stringsSize(f.Namespaces)
	case *Welcome:
		return base + 256 + len(f.DataMeta) + stringsSize(f.Namespaces)
	case *Lookup:
		return base + keysSize(f.Keys)
	case *Fetch:
		return base + keysSize(f.Keys) + 5*len(f.Dest) + 5*len(f.Sizes) + 8
	case *LookupResp:
		n := base + 5*len(f.Hits) + 5*len(f.Sizes) + 13
		for _, p := range f.Prov {
			if p != nil {
				n += 64 + len(p.ParentHash) + 4*len(p.TokenIDs) + len(p.LoRAName) + stringsSize(p.ExtraKeys)
			} else {
				n++
			}
		}
		return n
	case *Refuse:
		return base + len(f.Reason) + len(f.Msg)
	case *TransferDone:
		return base + len(f.Reason)
	case *Bye:
		return base + len(f.Reason)
	}
	return base
}

func keysSize(keys []Key) int {
	n := 5
	for i := range keys {
		n += 12 + len(keys[i].Namespace) + len(keys[i].Hash)
	}
	return n
}

func stringsSize(ss []string) int {
	n := 5
	for _, s := range ss {
		n += 5 + len(s)
	}
	return n
}
