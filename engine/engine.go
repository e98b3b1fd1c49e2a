// Package engine is the API an inference engine programs against: the
// Manager (vLLM's offloading-manager semantics, docs/DESIGN.md §3.1) and the slot
// memory it copies to and from. It is a leaf: the embedded node (package
// kvtier) and the standalone daemon's Go client (scheduler/client) both
// implement it, and an engine that imports only this package and the client
// pulls in no actor system, no S3 client, no metrics.
//
// It owns no state and starts nothing; it must never import the node.
package engine

import (
	"context"

	"github.com/kvtier/kvtier/messages"
)

// Manager is the API an inference engine's scheduler calls, with vLLM's
// offloading-manager semantics (docs/DESIGN.md §3.1). Calls come from one engine
// scheduler thread, once per engine step; every call is answered by an actor
// and bounded by ctx's deadline.
//
// The embedded node (kvtier.Node.Manager) and the standalone daemon's Go
// client (scheduler/client) implement the same interface.
type Manager interface {
	// Lookup answers MISS, HIT, HIT_PENDING or RETRY per key. A HIT is leased to
	// req until PrepareLoad, RequestFinished or the lease's expiry, so it cannot
	// be evicted in between. With prefix set, the scan stops at the first key
	// that is not a HIT and the remaining keys answer MISS without being leased.
	Lookup(ctx context.Context, req *messages.ReqContext, keys []messages.Key, prefix bool) ([]messages.LookupStatus, error)

	// PrepareLoad turns req's leases on keys into read pins and returns a load
	// job with the slot of each key. All-or-nothing: it never fails for keys
	// that were leased HITs of req; for a key that is not resident it returns
	// ErrUnknownKey and pins nothing.
	PrepareLoad(ctx context.Context, req *messages.ReqContext, keys []messages.Key) (messages.LoadJob, error)

	// Touch marks keys recently used for eviction, the last key most
	// recent. Unknown keys are ignored. An engine that wants vLLM's cache
	// calls it once per finished request, after its last PrepareStore and
	// before RequestFinished, with every key the request loaded or offered
	// to PrepareStore, tail first — so the prompt's head ends most recent
	// and a chain is evicted from its tail (vLLM's on_request_finished).
	// The CPU tier ranks nothing at lookup or load, and a stored block at
	// its commit only when no touch ranked it first: an engine that never
	// touches gets its blocks aged by their store alone. tools/sim's
	// engine touches this way, checked against a reference model.
	Touch(ctx context.Context, req *messages.ReqContext, keys []messages.Key) error

	// CompleteLoad unpins keys that req prepared for load. A key req is not
	// loading returns ErrNotLoading (nothing is unpinned twice).
	CompleteLoad(ctx context.Context, req *messages.ReqContext, keys []messages.Key) error

	// PrepareStore reserves slots for the keys not yet present, evicting in
	// policy order. ErrFull when it cannot reserve them all (nothing reserved).
	PrepareStore(ctx context.Context, req *messages.ReqContext, keys []messages.Key) (messages.StorePlan, error)

	// CompleteStore ends req's writes of keys: ok makes them readable and
	// announces them; !ok frees their slots. ErrNotPending for keys req has
	// no write in flight for (including a second CompleteStore).
	CompleteStore(ctx context.Context, req *messages.ReqContext, keys []messages.Key, ok bool) error

	// JobDone is one worker's report for a transfer job. A job completes when
	// all its workers have reported (ok only if all were ok). Reports for
	// unknown, finished or reaped jobs return ErrUnknownJob and are counted.
	JobDone(ctx context.Context, job messages.JobID, worker int, ok bool) error

	// RequestFinished: no more submit-side calls for req. Its leases are
	// released; its in-flight jobs still complete.
	RequestFinished(ctx context.Context, req *messages.ReqContext) error

	// TakeEvents drains the events announced since the last call.
	TakeEvents(ctx context.Context) ([]messages.Event, error)

	// HasPendingWork reports whether work needs an engine step to progress:
	// true exactly while an engine transfer job (a PrepareLoad's or a
	// PrepareStore's) awaits worker reports (JobDone) or its
	// CompleteLoad/CompleteStore. Nothing else counts, because nothing else
	// needs the engine: serving peers (lookups, producer leases, fetches
	// written from our slots), fetching from peers, promotions from a
	// secondary tier, cascades to one, commits being checksummed, and idle
	// sessions all progress on their own messages and timers. An idle
	// engine with peers attached can therefore always stop stepping, pause
	// and shut down (seed 002).
	HasPendingWork(ctx context.Context) (bool, error)

	// Pause stops engine intake and returns once every engine job opened
	// before it has finished or been reaped at its own deadline (it needs
	// the engine's reports to drain sooner). While paused:
	//   - Lookup answers MISS for every key (nothing is leased, no
	//     secondary or peer lookup starts);
	//   - PrepareLoad and PrepareStore fail with messages.ErrPaused;
	//   - JobDone, CompleteLoad, CompleteStore, Touch, RequestFinished,
	//     TakeEvents, Stats and HasPendingWork work as ever, so in-flight
	//     jobs drain;
	//   - peers are still served from the CPU tier: pause quiesces the
	//     engine, not the node.
	// With clearCache the primary tier is then cleared (as ResetCache does):
	// every ready block goes, its leases with it — a peer round whose hits
	// were leased but not yet fetched fails its fetch cleanly and is never
	// served stale. Secondary tiers persist. NB: a block pinned at that
	// moment by a transfer in flight (a peer's fetch or a cascade reading
	// it) is not freed from under the transfer, and stays readable after it.
	Pause(ctx context.Context, clearCache bool) error
	// Resume restores engine intake. Resuming a node that is not paused does
	// nothing; after Close it fails with messages.ErrClosed.
	Resume(ctx context.Context) error
	// ResetCache drains in-flight engine jobs up to ctx's deadline (reaping the
	// rest), then clears the primary tier.
	ResetCache(ctx context.Context) error

	// Stats returns a snapshot of counters and gauges.
	Stats(ctx context.Context) (messages.Stats, error)

	// Pool is the slot memory the engine copies to and from.
	Pool() SlotMemory
}

// SlotMemory is the CPU pool's bytes, addressed by slot index.
type SlotMemory interface {
	// Slot returns the bytes of slot i (len BlockBytes), aliasing the pool.
	Slot(i int) []byte
	// BlockBytes is the size of every slot.
	BlockBytes() int
	// Slots is the number of slots.
	Slots() int
}
