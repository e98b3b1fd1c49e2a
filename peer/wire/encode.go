package wire

import "encoding/binary"

// Encode encodes f as one frame of protocol Version: a msgpack map (see
// docs/PROTOCOL.md, "Peer protocol"). It refuses, with an *Error, a frame
// that Decode would refuse: a bound, exact length or consistency rule
// broken, a Hello or Welcome whose Version is not Version, a nil frame.
func Encode(f Frame) ([]byte, error) {
	if err := check(f); err != nil {
		return nil, err
	}
	w := writer{b: make([]byte, 0, sizeHint(f))}
	encode(&w, f)
	if len(w.b) > MaxFrameBytes {
		return nil, tooLarge(OpName(f), "", "frame of %d bytes (max %d)", len(w.b), MaxFrameBytes)
	}
	return w.b, nil
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
		w.str("mac")
		w.bin(f.MAC)
	case *Ready:
		header(w, 3, opReady, f.Epoch)
	case *Refuse:
		header(w, 4+count(f.Msg != ""), opRefuse, f.Epoch)
		w.str("reason")
		w.str(f.Reason)
		if f.Msg != "" {
			w.str("msg")
			w.str(f.Msg)
		}
	case *Lookup:
		header(w, 5, opLookup, f.Epoch)
		round(w, f.Round)
		encodeKeys(w, f.Keys)
	case *LookupResp:
		encodeResp(w, f)
	case *Fetch:
		header(w, 7, opFetch, f.Epoch)
		round(w, f.Round)
		encodeKeys(w, f.Keys)
		w.str("dest")
		w.arrayLen(len(f.Dest))
		for _, s := range f.Dest {
			w.uint(uint64(s))
		}
		w.str("token")
		w.bin(f.Token)
	case *TransferDone:
		header(w, 5+count(f.Reason != ""), opTransferDone, f.Epoch)
		round(w, f.Round)
		w.str("ok")
		w.bool(f.OK)
		if f.Reason != "" {
			w.str("reason")
			w.str(f.Reason)
		}
	case *Abort:
		header(w, 4, opAbort, f.Epoch)
		round(w, f.Round)
	case *AbortAck:
		header(w, 4, opAbortAck, f.Epoch)
		round(w, f.Round)
	case *Ping:
		header(w, 4, opPing, f.Epoch)
		w.str("seq")
		w.uint(f.Seq)
	case *Pong:
		header(w, 4, opPong, f.Epoch)
		w.str("seq")
		w.uint(f.Seq)
	case *Bye:
		header(w, 3+count(f.Reason != ""), opBye, f.Epoch)
		if f.Reason != "" {
			w.str("reason")
			w.str(f.Reason)
		}
	}
}

func count(on bool) int {
	if on {
		return 1
	}
	return 0
}

// header writes the map header and the fields every frame has: v, op, e.
func header(w *writer, fields int, o op, epoch uint64) {
	w.mapLen(fields)
	w.str("v")
	w.uint(Version)
	w.str("op")
	w.str(opNames[o])
	w.str("e")
	w.uint(epoch)
}

func round(w *writer, r uint64) {
	w.str("round")
	w.uint(r)
}

func encodeHalf(w *writer, o op, node string, epoch uint64, nonce []byte, ns []string,
	blockBytes, slots int, transport string, meta, mac []byte) {
	header(w, 8+count(len(ns) > 0)+count(len(meta) > 0)+count(o == opWelcome), o, epoch)
	w.str("node")
	w.str(node)
	w.str("nonce")
	w.bin(nonce)
	if len(ns) > 0 {
		w.str("ns")
		writeStrings(w, ns)
	}
	w.str("block_bytes")
	w.uint(uint64(blockBytes))
	w.str("slots")
	w.uint(uint64(slots))
	w.str("transport")
	w.str(transport)
	if len(meta) > 0 {
		w.str("meta")
		w.bin(meta)
	}
	if o == opWelcome {
		w.str("mac")
		w.bin(mac)
	}
}

func writeStrings(w *writer, ss []string) {
	w.arrayLen(len(ss))
	for _, s := range ss {
		w.str(s)
	}
}

// encodeKeys writes keys as an array of [namespace str, hash bin, group uint].
func encodeKeys(w *writer, keys []Key) {
	w.str("keys")
	w.arrayLen(len(keys))
	for i := range keys {
		k := &keys[i]
		w.b = append(w.b, 0x93)
		w.str(k.Namespace)
		w.bin(k.Hash)
		w.uint(uint64(k.Group))
	}
}

func encodeResp(w *writer, f *LookupResp) {
	header(w, 6+count(len(f.Prov) > 0), opLookupResp, f.Epoch)
	round(w, f.Round)
	w.str("hits")
	w.binHeader(len(f.Hits))
	for _, h := range f.Hits {
		w.b = append(w.b, byte(count(h)))
	}
	w.str("crc")
	w.binHeader(4 * len(f.Checksums))
	for _, c := range f.Checksums {
		w.b = binary.LittleEndian.AppendUint32(w.b, c)
	}
	if len(f.Prov) == 0 {
		return
	}
	w.str("prov")
	w.arrayLen(len(f.Prov))
	for _, p := range f.Prov {
		encodeProv(w, p)
	}
}

// encodeProv writes p as a map of its non-zero fields, nil as msgpack nil.
func encodeProv(w *writer, p *Provenance) {
	if p == nil {
		w.nil_()
		return
	}
	w.mapLen(count(len(p.ParentHash) > 0) + count(len(p.TokenIDs) > 0) + count(p.BlockSize != 0) +
		count(p.LoRAID != 0) + count(p.LoRAName != "") + count(len(p.ExtraKeys) > 0))
	if len(p.ParentHash) > 0 {
		w.str("parent")
		w.bin(p.ParentHash)
	}
	if len(p.TokenIDs) > 0 {
		w.str("tokens")
		w.binHeader(4 * len(p.TokenIDs))
		for _, t := range p.TokenIDs {
			w.b = binary.LittleEndian.AppendUint32(w.b, uint32(t))
		}
	}
	if p.BlockSize != 0 {
		w.str("block_size")
		w.uint(uint64(p.BlockSize))
	}
	if p.LoRAID != 0 {
		w.str("lora_id")
		w.int(int64(p.LoRAID))
	}
	if p.LoRAName != "" {
		w.str("lora_name")
		w.str(p.LoRAName)
	}
	if len(p.ExtraKeys) > 0 {
		w.str("extra")
		writeStrings(w, p.ExtraKeys)
	}
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
		return base + keysSize(f.Keys) + 5*len(f.Dest)
	case *LookupResp:
		n := base + 5*len(f.Hits) + 5
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
