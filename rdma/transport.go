// Package rdma is kvtier's data plane: it moves block bytes between the CPU
// pools of two nodes once the control plane (peer/) has agreed which slots
// go where. It owns the registration of the local pool with a transport,
// the transport's own connections and its completions. It never decides
// what to move, never touches the CPU tier's metadata, and never reads a
// slot it was not handed for one transfer.
//
// The Transport interface is shaped after NIXL (rdma/nixl maps onto it one
// call to one call): the pool is registered once, each node's opaque
// metadata travels in the peer handshake, and a fetch is one WRITE of a
// list of local slots into a list of remote slots, named by a one-time
// token the consumer chose and announced over the authenticated control
// plane. Completions are callbacks that the owning actor turns into
// messages: nothing here blocks a mailbox, and nothing polls while no
// transfer is in flight.
//
// A block of n bytes sits at the start of its slot, n <= the slot's size:
// one node's pool may hold blocks of several sizes (one per namespace), and
// two nodes' slots may differ in size while the blocks they exchange are
// the same size. Every transfer therefore names a length per entry; nil
// lengths mean whole slots of the caller's own pool.
//
// Implementations: rdma/tcp (pure Go, the default) and rdma/nixl (cgo,
// build tag nixl).
package rdma

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
)

// Region is the local memory a transport registers once: the CPU pool, as
// Slots consecutive slots of SlotBytes each (the grid), and, in a pool
// that serves blocks of several sizes, more slot ids that Locate places in
// the same memory.
type Region struct {
	Base      []byte // the whole pool mapping; len(Base) >= Slots*SlotBytes
	SlotBytes int    // bytes per slot of the grid
	Slots     int    // number of slots of the grid: ids 0..Slots-1
	// Locate places a slot id beyond the grid: its offset in Base and its
	// bytes (0: no such slot). A pool of several block sizes numbers each
	// size's slots after the grid's, all of them in Base; the set of ids
	// may grow while the transport runs, so Locate is asked per call. Nil:
	// the grid is every slot. Ids of different sizes may share bytes: which
	// of them hold blocks is the CPU tier's to keep apart, never a peer's.
	Locate func(slot int) (off, size int)
	// IDs bounds every slot id Locate may ever place (ids 0..IDs-1); it is
	// what a peer is told, once. 0: Slots.
	IDs int
	// MaxSlotBytes bounds the bytes of every slot Locate may ever place.
	// 0: SlotBytes.
	MaxSlotBytes int
}

// span is slot i's offset and bytes; size 0 for an id with no slot.
func (r Region) span(i int) (off, size int) {
	switch {
	case i >= 0 && i < r.Slots:
		return i * r.SlotBytes, r.SlotBytes
	case i >= r.Slots && r.Locate != nil:
		return r.Locate(i)
	}
	return 0, 0
}

// Slot returns slot i's bytes. It panics for an id no slot has: callers
// check ids first (Valid), and a wrong one must never alias slot 0.
func (r Region) Slot(i int) []byte {
	off, n := r.span(i)
	if n == 0 {
		panic(fmt.Sprintf("rdma: slot %d is no slot of the region", i))
	}
	return r.Base[off : off+n : off+n]
}

// Block returns the first n bytes of slot i: a block of n bytes in it. It
// panics for an id no slot has or a block longer than its slot (callers
// check both first: Valid, Lengths).
func (r Region) Block(i, n int) []byte {
	off, size := r.span(i)
	if size == 0 || n > size {
		panic(fmt.Sprintf("rdma: a block of %d bytes in slot %d of %d", n, i, size))
	}
	return r.Base[off : off+n : off+n]
}

// SlotSize is the bytes of slot i: 0 for an id with no slot.
func (r Region) SlotSize(i int) int {
	_, n := r.span(i)
	return n
}

// IDLimit bounds the region's slot ids: every id is below it.
func (r Region) IDLimit() int { return max(r.IDs, r.Slots) }

// MaxSlot is the largest slot the region has or may have.
func (r Region) MaxSlot() int { return max(r.MaxSlotBytes, r.SlotBytes) }

// Grid is the region without the ids beyond its grid: for a transport
// that can only address slots of one size (nixl's prepared descriptors).
func (r Region) Grid() Region { return Region{Base: r.Base, SlotBytes: r.SlotBytes, Slots: r.Slots} }

// Lengths resolves the lengths of a call of count entries: nil means whole
// slots of slotBytes; otherwise there must be exactly count, each within
// 1..limit (the smaller of the two sides' slot sizes, where both are
// known). The result is the caller's to keep (a copy).
func Lengths(lens []int, count, slotBytes, limit int) ([]int, error) {
	out := make([]int, count)
	if lens == nil {
		if slotBytes > limit {
			return nil, fmt.Errorf("whole slots of %d bytes into slots of %d: %w", slotBytes, limit, ErrBadLength)
		}
		for i := range out {
			out[i] = slotBytes
		}
		return out, nil
	}
	if len(lens) != count {
		return nil, fmt.Errorf("%d lengths for %d slots: %w", len(lens), count, ErrBadLength)
	}
	for i, n := range lens {
		if n <= 0 || n > limit {
			return nil, fmt.Errorf("entry %d: %d bytes, want 1..%d: %w", i, n, limit, ErrBadLength)
		}
		out[i] = n
	}
	return out, nil
}

// Lengths resolves the lengths of a call on the region's slots: nil means
// each slot whole; otherwise one per slot, each within 1..its slot's bytes
// and 1..limit (the other side's largest slot; 0: no such bound). The
// slots must be Valid. The result is the caller's to keep.
func (r Region) Lengths(slots, lens []int, limit int) ([]int, error) {
	if lens != nil && len(lens) != len(slots) {
		return nil, fmt.Errorf("%d lengths for %d slots: %w", len(lens), len(slots), ErrBadLength)
	}
	out := make([]int, len(slots))
	for i, s := range slots {
		size := r.SlotSize(s)
		n := size
		if lens != nil {
			n = lens[i]
		}
		bound := size
		if limit > 0 {
			bound = min(bound, limit)
		}
		if n <= 0 || n > bound {
			return nil, fmt.Errorf("entry %d: %d bytes into slot %d, want 1..%d: %w", i, n, s, bound, ErrBadLength)
		}
		out[i] = n
	}
	return out, nil
}

// Sum is the total of lengths: a transfer's payload bytes.
func Sum(lens []int) int64 {
	var n int64
	for _, l := range lens {
		n += int64(l)
	}
	return n
}

// Valid reports whether every slot id names a slot of the region.
func (r Region) Valid(slots []int) bool {
	for _, s := range slots {
		if r.SlotSize(s) == 0 {
			return false
		}
	}
	return true
}

// Token names one transfer. The consumer draws it at random (NewToken),
// registers it with Expect, and sends it to the producer inside the
// authenticated Fetch frame; the data plane accepts bytes only for a token
// that is expected from that peer, once.
type Token [16]byte

// NewToken draws a random token.
func NewToken() Token {
	var t Token
	if _, err := rand.Read(t[:]); err != nil {
		panic("rdma: no randomness: " + err.Error()) // crypto/rand never fails on Linux
	}
	return t
}

func (t Token) String() string { return hex.EncodeToString(t[:4]) }

// Completion reports the end of one Expect or Write. It is delivered
// exactly once per call, through the call's done callback.
type Completion struct {
	Token Token
	Peer  string // the remote node id
	Bytes int64  // payload bytes moved: the sum of the entries' lengths
	Err   error  // nil: every byte is in place (Expect) / handed off (Write)
}

// Transport moves slot bytes between two registered pools.
//
// Contract, for every implementation (rdma/rdmatest checks it):
//   - Register is called once, before any other call but Kind.
//   - Expect's done is called exactly once, with Err nil only when every
//     byte of every dst slot has been written; after done returns the
//     transport never writes those slots again (so the caller may free or
//     reuse them). Cancel makes done come with ErrCanceled, once it is safe.
//   - Write's done is called exactly once, when the src slots may be reused
//     (the bytes were copied out or the write failed).
//   - Bytes for a token are accepted only from the peer the token was
//     expected from, only into the slots it was expected with (and at the
//     lengths it was expected with), and only once; anything else is refused with ErrProtocol and counted, and the
//     expectation is left intact for the real producer.
//   - Disconnect(peer) fails that peer's pending Expects and Writes
//     (ErrPeerGone); Close fails everything (ErrClosed) and returns once no
//     goroutine of the transport remains.
//   - An error returned by Expect or Write means the call did nothing and
//     its done is never called. Expect and Write need a prior Connect of
//     the peer (ErrPeerUnknown).
//   - A producer that breaks off inside a payload leaves the expectation
//     pending (its slots may hold partial bytes, done has not run): the
//     owner's Cancel, Disconnect or a complete retry under the same token
//     ends it. Completion.Bytes is 0 on failure.
//   - One-sided transports (nixl) cannot stop a remote WRITE once posted:
//     their Cancel reports ErrCanceled only after a grace period long
//     enough for the peer's own write deadline (documented per transport).
//   - No call blocks on the network; done callbacks run on transport
//     goroutines and must not block (send a message and return).
type Transport interface {
	// Kind names the transport: "tcp" or "nixl".
	Kind() string
	// Register registers the local pool. Called once.
	Register(r Region) error
	// Metadata is this node's opaque data-plane metadata, carried in the
	// peer handshake (an address for tcp, an agent blob for nixl).
	Metadata() []byte
	// Connect makes peer reachable for Write, from the metadata it sent in
	// its handshake. A second Connect for the same peer replaces the first
	// (a new session epoch); pending work of the old one fails.
	Connect(peer string, meta []byte) error
	// Disconnect forgets peer: its pending Expects and Writes fail with
	// ErrPeerGone.
	Disconnect(peer string)
	// Expect (consumer side) accepts one transfer from peer under tok into
	// the local dst slots, lens[i] bytes at the start of dst[i] (nil: whole
	// slots); done reports its end. A length outside 1..the slot size is
	// refused (ErrBadLength).
	Expect(peer string, tok Token, dst, lens []int, done func(Completion)) error
	// Cancel (consumer side) abandons an Expect; its done comes with
	// ErrCanceled once the transport no longer touches the slots. Unknown
	// or finished tokens are ignored.
	Cancel(tok Token)
	// Write (producer side) copies the first lens[i] bytes of the local
	// src[i] into the start of peer's dst[i] under tok (len(src) ==
	// len(dst) == len(lens); nil lens: whole local slots); done reports its
	// end. A length beyond either side's slot size, where the transport
	// knows the peer's, is refused (ErrBadLength).
	Write(peer string, tok Token, src, dst, lens []int, done func(Completion)) error
	// Stats is a snapshot of the transport's counters.
	Stats() Stats
	// Close fails everything pending, releases the registration and waits
	// for the transport's goroutines; idempotent; never call it from done.
	Close() error
}

// Stats are a transport's counters.
type Stats struct {
	Kind           string `json:"kind"`
	BytesSent      uint64 `json:"bytes_sent"`
	BytesReceived  uint64 `json:"bytes_received"`
	WritesOK       uint64 `json:"writes_ok"`
	WritesFailed   uint64 `json:"writes_failed"`
	ExpectsOK      uint64 `json:"expects_ok"`
	ExpectsFailed  uint64 `json:"expects_failed"`
	Refused        uint64 `json:"refused"`         // transfers refused: unknown token, wrong peer or slots, bad frame
	PendingExpects int    `json:"pending_expects"` // expectations not yet complete
	PendingWrites  int    `json:"pending_writes"`  // writes not yet complete
}

// Errors every transport returns (wrapped with context).
var (
	// ErrUnavailable: the transport cannot run here (library missing or
	// incompatible, no device). The node refuses to start with it.
	ErrUnavailable = errors.New("rdma: transport unavailable")
	// ErrPeerUnknown: Expect or Write for a peer with no Connect.
	ErrPeerUnknown = errors.New("rdma: peer not connected")
	// ErrPeerGone: the peer was disconnected, its connection broke, or it
	// reconnected with a new session (what the old one had in flight ends).
	ErrPeerGone = errors.New("rdma: peer gone")
	// ErrCanceled: the expectation was canceled by its owner.
	ErrCanceled = errors.New("rdma: transfer canceled")
	// ErrProtocol: the remote side broke the data-plane protocol (unknown
	// token, wrong slots, short or malformed frame).
	ErrProtocol = errors.New("rdma: protocol violation")
	// ErrBadSlot: a slot index outside the registered region (local or, as
	// advertised, remote).
	ErrBadSlot = errors.New("rdma: slot out of range")
	// ErrBadLength: a block length of 0, or beyond a slot it is read from or
	// written into (local or, as advertised, remote).
	ErrBadLength = errors.New("rdma: block length outside its slot")
	// ErrDuplicateToken: Expect with a token already pending.
	ErrDuplicateToken = errors.New("rdma: duplicate token")
	// ErrClosed: the transport is closed.
	ErrClosed = errors.New("rdma: transport closed")
	// ErrNotRegistered: a call before Register.
	ErrNotRegistered = errors.New("rdma: pool not registered")
)
