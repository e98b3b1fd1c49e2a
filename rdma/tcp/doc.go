// Package tcp is kvtier's default data plane: a pure-Go rdma.Transport
// over plain TCP. The producer writes a list of its pool slots into a
// list of the consumer's slots under a one-time token; the consumer reads
// the payload straight into its registered pool.
//
// It owns: the data-plane listener, every data-plane connection (inbound
// and outbound), the table of pending expectations, the per-peer pool of
// outbound connections and queue of Writes, and the transport's counters.
// It never touches a slot outside the dst list of an expectation it is
// completing or the src list of a Write it is sending; never touches the
// CPU tier's metadata; never decides what to move; and does not
// authenticate anyone: the node id in a preface is a claim, checked only
// against the peer a token was expected from. The authority is the token
// — random, 128 bits, announced over the authenticated control plane
// (peer/) — together with the exact slot list expected with it.
//
// # Goroutines, timers and calls
//
// Register starts one accept goroutine; each accepted connection gets one
// reader goroutine. A Write runs on a worker goroutine, at most
// MaxConnsPerPeer per peer, each owning one connection for as long as the
// peer's queue has Writes; then the connection is parked idle with no
// goroutine and no timer, and reused (newest first) by the next Write.
// Deadlines are armed only while a transfer is in flight (WriteTimeout
// per Write, from dial to ack) and on a fresh inbound connection until
// its preface (WriteTimeout); they are cleared afterwards. An idle
// transport is one goroutine blocked in Accept and one blocked in Read
// per inbound connection: no wakeups. Before reusing a connection idle for
// more than a second, the worker peeks at it without blocking
// (MSG_PEEK|MSG_DONTWAIT, Linux) and redials if the consumer has closed
// it; a close that slips past the probe is covered by the retry below.
//
// No call blocks on the network. Expect and Write validate and return;
// an error from them means done is never called, nil means done is
// called exactly once. done runs on a transport goroutine, never under a
// lock and never on the caller's goroutine (Cancel, Disconnect, Connect
// and Close hand completions to a goroutine of their own). Close waits for
// every goroutine of the transport, so it must not be called from done.
//
// # Rules
//
//   - Expect needs the peer Connect'ed (ErrPeerUnknown otherwise), a
//     non-empty dst inside the pool (ErrBadSlot), a length per slot within
//     1..the slot size or nil for whole slots (ErrBadLength) and a token
//     not already pending (ErrDuplicateToken).
//   - Write needs the peer Connect'ed, src and dst of equal non-zero
//     length, src inside the local pool, dst inside the pool the peer
//     advertised in its metadata (ErrBadSlot), and a length per block
//     within 1..the smaller of the two pools' slot sizes, or nil for whole
//     local slots (ErrBadLength). The pools' slot sizes may differ: a
//     block of n bytes sits at the start of its slot on both sides.
//   - A transfer is accepted only if its token is pending, was expected
//     from the node named in the connection's preface (in the same Connect
//     epoch), no other connection is inside its payload, and its count and
//     its (slot, length) list (order included) equal the expected ones.
//     Otherwise it is refused: counted in Stats.Refused, logged, a refusal
//     ack is written if possible and the connection is closed. The
//     expectation is untouched and no payload byte has reached the pool.
//     The producer's Write fails with ErrProtocol (refusal ack read) or
//     ErrPeerGone (the connection closed first).
//   - A producer that breaks off inside a payload (EOF, reset) is refused
//     and counted too, and the expectation is released intact: still
//     pending, for a complete transfer under the same token (a retry on a
//     new connection) or for its owner's Cancel, Disconnect or deadline.
//     Its slots may hold partial bytes; done(nil) comes only after every
//     byte of a complete payload.
//   - Cancel: if no reader is inside the payload, done(ErrCanceled) at
//     once; otherwise the reader's connection is closed and the reader
//     calls done(ErrCanceled) once it has returned from its last read into
//     the slots. Disconnect (ErrPeerGone), a second Connect of the same
//     peer (ErrPeerGone, the old epoch) and Close (ErrClosed) end pending
//     Expects the same way, fail queued and in-flight Writes to that peer,
//     and close its connections in both directions.
//   - A Write whose reused connection breaks before its ack (the
//     consumer closed it while idle and the close crossed the transfer)
//     is retried once on a new connection, within the same WriteTimeout.
//     Tokens being one-time makes this safe: a consumer that took every
//     byte refuses the retry; one that took part of them kept the
//     expectation pending. A new connection that breaks is not retried.
//   - The consumer calls done(nil), then acks. The producer calls done
//     after the ack (so the src slots are no longer read), or after the
//     failure, at most WriteTimeout after a worker picked the Write up
//     (queueing behind MaxConnsPerPeer busy connections is not counted).
//
// # Wire format
//
// All integers are unsigned, big-endian. A connection is opened by the
// producer, and carries transfers one after another, each acked before
// the next is sent.
//
// Preface, once per connection, producer → consumer:
//
//	offset size  field
//	0      4     magic "KVTD" (4B 56 54 44)
//	4      1     version = 2
//	5      1     n = length of the sender's node id, 1..255
//	6      n     sender's node id (bytes)
//
// Version 1 carried one slot size per transfer and moved whole slots of
// equal size; a version-2 consumer refuses its preface.
//
// Transfer header, producer → consumer:
//
//	offset size  field
//	0      16    token (rdma.Token)
//	16     4     count = number of blocks, 1..consumer's pool slots
//	20     8×count  per block: dst slot index (4), each < consumer's pool
//	                slots, then its length in bytes (4), 1..consumer's
//	                slot bytes
//
// Payload, producer → consumer: the blocks' bytes back to back, the i-th
// block's length bytes read from the start of the i-th src slot landing
// at the start of the i-th dst slot (the rest of the slot is untouched).
// The producer sends header and payload in one writev straight from its
// pool; the consumer reads each block with io.ReadFull straight into its
// pool.
//
// Ack, consumer → producer, one byte per transfer:
//
//	0x00  ok: every payload byte is in the consumer's slots
//	0x01  refused: the transfer was not accepted; the consumer closes
//
// Any other value is a protocol error; the producer drops the connection.
//
// The consumer decodes strictly and bounds before it allocates: the
// preface's node id is at most 255 bytes; the header's count is checked
// against its pool's slot ids, then against the expectation's, before the
// entries are read.
//
// # Metadata
//
// Metadata(), carried in the peer handshake (Hello/Welcome DataMeta):
//
//	offset size  field
//	0      1     version = 1
//	1      4     slot bytes of the registered pool: the largest block a
//	             slot holds (in a pool of several block sizes, the largest
//	             slot it may ever have, rdma.Region.MaxSlot)
//	5      4     slots of the registered pool: every slot id is below it
//	             (rdma.Region.IDLimit)
//	9      1     n = length of the address, 1..255
//	10     n     address to dial, "host:port" (Config.Advertise, else the
//	             listener's address)
//
// The length must be exactly 10+n. Connect refuses anything else.
package tcp
