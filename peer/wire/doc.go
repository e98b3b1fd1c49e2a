// Package wire is the codec of the peer control plane (docs/PROTOCOL.md,
// "Peer protocol"): how the frames two kvtier nodes exchange over their
// ZeroMQ ROUTER/DEALER sockets — handshake, lookup rounds, fetches, aborts,
// liveness — are encoded as msgpack maps, and how the handshake is
// authenticated (ServerMAC, ClientMAC over a canonical transcript).
//
// It owns the frame schemas (frames.go), their bounds and the MAC
// transcript. It holds no state, starts nothing and never touches a socket:
// the peer sessions (peer/) do the I/O and own the semantics (epochs,
// rounds, leases, allow-lists).
//
// Decoding is strict: every field has one msgpack type, every length, count
// and integer is checked against its bound and against what the frame
// really holds before anything is allocated, unknown, repeated and missing
// fields are refused, and the consistency rules (len(Dest) == len(Keys),
// one checksum per hit, ...) are checked by the same code Encode runs, so
// anything that decodes re-encodes. Errors are *Error wrapping ErrMalformed
// (refined by ErrTooLarge, ErrUnknownOp) or ErrVersion; Reason gives the
// counter label. Decode never panics (FuzzDecode).
package wire
