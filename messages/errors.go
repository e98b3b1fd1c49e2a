package messages

import (
	"errors"
	"fmt"
)

// Every sentinel error of the public vocabulary, grouped by the path that
// returns it. Callers test them with errors.Is; the node wraps them with
// context.

// Sentinel errors returned by the manager API.
var (
	// ErrFull: PrepareStore could not reserve slots: every candidate is pinned,
	// leased or write-pending.
	ErrFull = errors.New("kvtier: primary tier full")
	// ErrUnknownKey: PrepareLoad or VerifyBlock of a key that is not resident
	// (never stored, evicted, or its lease expired before PrepareLoad).
	ErrUnknownKey = errors.New("kvtier: unknown key")
	// ErrNotPending: CompleteStore for a key that this request has no write in
	// flight for (double CompleteStore, or never prepared).
	ErrNotPending = errors.New("kvtier: no pending store for key")
	// ErrNotLoading: CompleteLoad for a key this request has not prepared.
	ErrNotLoading = errors.New("kvtier: no load in flight for key")
	// ErrUnknownJob: JobDone for a job id that is not in flight (finished,
	// reaped or never issued).
	ErrUnknownJob = errors.New("kvtier: unknown job")
	// ErrBadWorker: JobDone from a worker index outside the job's expected
	// workers, or from a worker that already reported the job.
	ErrBadWorker = errors.New("kvtier: worker index out of range")
	// ErrBadKey: a malformed key: one the engine protocol cannot decode, a
	// namespace longer than a stored block takes, or (standalone) a namespace
	// the daemon does not serve.
	ErrBadKey = errors.New("kvtier: malformed key")
	// ErrPaused: PrepareLoad or PrepareStore while the node is paused; engine
	// intake is stopped.
	ErrPaused = errors.New("kvtier: paused")
	// ErrClosed: the node is shutting down or closed.
	ErrClosed = errors.New("kvtier: closed")
	// ErrBadConfig: a configuration value is invalid.
	ErrBadConfig = errors.New("kvtier: bad config")
	// ErrChecksum: a block's bytes do not match its checksum (VerifyBlock, a
	// secondary tier's write of a slot or its read of a stored block).
	ErrChecksum = errors.New("kvtier: checksum mismatch")
)

// Sentinel errors of the secondary tiers.
var (
	// ErrNotFound: the tier does not hold the block.
	ErrNotFound = errors.New("kvtier: block not in tier")
	// ErrTierFull: the tier has no room (capacity reached with nothing
	// evictable, or the device said ENOSPC); the write was dropped.
	ErrTierFull = errors.New("kvtier: secondary tier full")
	// ErrTierUnavailable: the tier is unhealthy (endpoint unreachable, disk
	// failing) or overloaded; the operation was shed.
	ErrTierUnavailable = errors.New("kvtier: secondary tier unavailable")
	// ErrTierBusy: the tier's I/O queue is full. Back-pressure, not absence:
	// the block is still there; ask again later. It is an ErrTierUnavailable.
	ErrTierBusy = fmt.Errorf("%w: I/O queue full", ErrTierUnavailable)
	// ErrInvalidBlock: a stored block failed validation (bad magic, wrong
	// key or length, checksum mismatch); it was removed and never served.
	ErrInvalidBlock = errors.New("kvtier: invalid stored block")
)

// Sentinel errors of the peer path.
var (
	// ErrPeerUnavailable: no session with that peer is ready (handshake not
	// done, refused, or the peer is gone).
	ErrPeerUnavailable = errors.New("kvtier: peer unavailable")
	// ErrPeerTimeout: a round passed its deadline; the consumer gave up.
	ErrPeerTimeout = errors.New("kvtier: peer round timed out")
	// ErrPeerRefused: the producer refused or failed the round, or answered
	// it inconsistently (hits or provenances not one per key).
	ErrPeerRefused = errors.New("kvtier: peer refused the round")
	// ErrLeaseLost: a key was read from a peer without a live lookup lease
	// (the round it names is not leased).
	ErrLeaseLost = errors.New("kvtier: peer lease lost")
)

// Errors of the engine protocol (docs/PROTOCOL.md). A client maps the wire's
// error codes back to these and to the manager API's sentinels above, so errors.Is
// works the same through a socket as in process.
var (
	// ErrBadRequest: a frame the endpoint could not decode, or a field of the
	// wrong type, out of bounds, unknown or missing.
	ErrBadRequest = errors.New("kvtier: malformed request")
	// ErrProtocolVersion: the request's protocol version is not served; or,
	// in a client, the daemon's Hello names a version the client does not
	// speak.
	ErrProtocolVersion = errors.New("kvtier: unsupported protocol version")
	// ErrUnknownOp: the request names an operation the endpoint does not know.
	ErrUnknownOp = errors.New("kvtier: unknown operation")
	// ErrNoSession: the connection has no live session (no Hello yet, or its
	// session expired after the grace period and everything it held was
	// released). Say Hello again.
	ErrNoSession = errors.New("kvtier: no engine session")
	// ErrBusy: too many calls of this connection are in flight, or too many
	// of its requests are open (no request_finished yet).
	ErrBusy = errors.New("kvtier: too many calls in flight")
	// ErrSizing: the daemon sizes its pool's slots from the first engine
	// that declares its bytes per block (kvtierd started with no block
	// size) and has none yet, or just took one: say Hello again, declaring
	// yours.
	ErrSizing = errors.New("kvtier: the pool is not sized yet")
	// ErrInternal: the endpoint failed in a way the caller cannot fix.
	ErrInternal = errors.New("kvtier: internal error")
	// ErrBadReply: a client received a reply it could not decode, or one
	// that names a slot outside the pool it mapped.
	ErrBadReply = errors.New("kvtier: malformed reply")
)
