package messages

import "errors"

// Sentinel errors returned by the manager API. Callers test them with
// errors.Is; the node wraps them with context.
var (
	// ErrFull: PrepareStore could not reserve slots: every candidate is pinned,
	// leased or write-pending.
	ErrFull = errors.New("kvtier: primary tier full")
	// ErrUnknownKey: the key is not resident (never stored, evicted, or its
	// lease expired before PrepareLoad).
	ErrUnknownKey = errors.New("kvtier: unknown key")
	// ErrNotPending: CompleteStore for a key that this request has no write in
	// flight for (double CompleteStore, or never prepared).
	ErrNotPending = errors.New("kvtier: no pending store for key")
	// ErrNotLoading: CompleteLoad for a key this request has not prepared.
	ErrNotLoading = errors.New("kvtier: no load in flight for key")
	// ErrUnknownJob: a job id that is not in flight (finished, reaped or never issued).
	ErrUnknownJob = errors.New("kvtier: unknown job")
	// ErrBadWorker: a worker index outside the job's expected workers.
	ErrBadWorker = errors.New("kvtier: worker index out of range")
	// ErrBadKey: a malformed key.
	ErrBadKey = errors.New("kvtier: malformed key")
	// ErrPaused: the node is paused; engine intake is stopped.
	ErrPaused = errors.New("kvtier: paused")
	// ErrClosed: the node is shutting down or closed.
	ErrClosed = errors.New("kvtier: closed")
	// ErrBadConfig: a configuration value is invalid.
	ErrBadConfig = errors.New("kvtier: bad config")
	// ErrChecksum: a block's bytes do not match its checksum.
	ErrChecksum = errors.New("kvtier: checksum mismatch")
)
