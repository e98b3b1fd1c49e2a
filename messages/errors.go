package messages

import "errors"

// Sentinel errors returned by the manager API. Callers test them with
// errors.Is; the node wraps them with context.
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
