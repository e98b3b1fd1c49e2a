package nixl

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/kvtier/kvtier/rdma"
)

// Metadata envelope (what Metadata returns and Connect reads), version 1,
// little-endian:
//
//	magic "KVNX" | version u8 | reserved u8 | agent length u16 |
//	slot bytes u64 | slots u64 | pool base address u64 |
//	agent name | NIXL metadata length u32 | NIXL metadata
//
// The NIXL blob is nixl_capi_get_local_md's output (connection info of the
// backend plus the registered pool); the fields around it are what the
// producer needs to address remote slots (base + i*slotBytes) and to check
// the two pools agree on the block size.
const (
	metaVersion  = 1
	metaFixed    = 4 + 1 + 1 + 2 + 8 + 8 + 8
	maxAgentName = 255
	maxNixlMD    = 64 << 20 // a pool registration is a few KiB; bound what a peer can make us allocate
)

var metaMagic = [4]byte{'K', 'V', 'N', 'X'}

// peerMeta is a decoded metadata envelope.
type peerMeta struct {
	Agent     string
	SlotBytes int
	Slots     int
	Base      uint64
	NixlMD    []byte
}

// errMeta wraps rdma.ErrProtocol: a malformed or incompatible envelope.
var errMeta = fmt.Errorf("nixl metadata: %w", rdma.ErrProtocol)

func encodeMeta(m peerMeta) []byte {
	b := make([]byte, 0, metaFixed+len(m.Agent)+4+len(m.NixlMD))
	b = append(b, metaMagic[:]...)
	b = append(b, metaVersion, 0)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.Agent)))
	b = binary.LittleEndian.AppendUint64(b, uint64(m.SlotBytes))
	b = binary.LittleEndian.AppendUint64(b, uint64(m.Slots))
	b = binary.LittleEndian.AppendUint64(b, m.Base)
	b = append(b, m.Agent...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.NixlMD)))
	return append(b, m.NixlMD...)
}

// decodeMeta parses an envelope, enforcing exact length and bounds. The
// returned NixlMD aliases b.
func decodeMeta(b []byte) (peerMeta, error) {
	var m peerMeta
	if len(b) < metaFixed {
		return m, fmt.Errorf("%w: %d bytes, short", errMeta, len(b))
	}
	if [4]byte(b[:4]) != metaMagic {
		return m, fmt.Errorf("%w: bad magic (not a nixl transport's metadata)", errMeta)
	}
	if b[4] != metaVersion {
		return m, fmt.Errorf("%w: version %d, want %d", errMeta, b[4], metaVersion)
	}
	agentLen := int(binary.LittleEndian.Uint16(b[6:]))
	slotBytes := binary.LittleEndian.Uint64(b[8:])
	slots := binary.LittleEndian.Uint64(b[16:])
	m.Base = binary.LittleEndian.Uint64(b[24:])
	if agentLen == 0 || agentLen > maxAgentName {
		return m, fmt.Errorf("%w: agent name length %d", errMeta, agentLen)
	}
	if slotBytes == 0 || slotBytes > 1<<40 || slots == 0 || slots > 1<<31 ||
		m.Base == 0 || m.Base+slotBytes*slots < m.Base {
		return m, fmt.Errorf("%w: pool geometry %d x %d at %#x", errMeta, slots, slotBytes, m.Base)
	}
	rest := b[metaFixed:]
	if len(rest) < agentLen+4 {
		return m, fmt.Errorf("%w: truncated agent name", errMeta)
	}
	m.Agent = string(rest[:agentLen])
	rest = rest[agentLen:]
	mdLen := int(binary.LittleEndian.Uint32(rest))
	rest = rest[4:]
	if mdLen == 0 || mdLen > maxNixlMD || len(rest) != mdLen {
		return m, fmt.Errorf("%w: NIXL metadata length %d, %d bytes follow", errMeta, mdLen, len(rest))
	}
	m.SlotBytes, m.Slots, m.NixlMD = int(slotBytes), int(slots), rest
	return m, nil
}

// Notification (the message NIXL delivers to the consumer once the WRITE's
// bytes are in place; NIXL sends it after the write and its flush complete):
//
//	magic "KVN1" | token [16]byte | slot count u32 | dst digest u32
//
// The digest is CRC32C over the destination slot indices (u32 LE each), so
// the consumer can tell the producer wrote the slots it expected.
const notifLen = 4 + 16 + 4 + 4

var notifMagic = [4]byte{'K', 'V', 'N', '1'}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// slotDigest is CRC32C over the slot indices.
func slotDigest(slots []int) uint32 {
	var buf [4]byte
	var h uint32
	for _, s := range slots {
		binary.LittleEndian.PutUint32(buf[:], uint32(s))
		h = crc32.Update(h, castagnoli, buf[:])
	}
	return h
}

type notif struct {
	Token  rdma.Token
	Count  int
	Digest uint32
}

func encodeNotif(n notif) []byte {
	b := make([]byte, 0, notifLen)
	b = append(b, notifMagic[:]...)
	b = append(b, n.Token[:]...)
	b = binary.LittleEndian.AppendUint32(b, uint32(n.Count))
	return binary.LittleEndian.AppendUint32(b, n.Digest)
}

func decodeNotif(b []byte) (notif, bool) {
	var n notif
	if len(b) != notifLen || [4]byte(b[:4]) != notifMagic {
		return n, false
	}
	copy(n.Token[:], b[4:20])
	n.Count = int(binary.LittleEndian.Uint32(b[20:]))
	n.Digest = binary.LittleEndian.Uint32(b[24:])
	return n, true
}
