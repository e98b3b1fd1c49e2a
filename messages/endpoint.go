package messages

import "time"

// Standalone mode: the engine endpoint (scheduler/endpoint) serves the
// manager API to out-of-process engines. These are the errors only the wire
// can produce, and the one bridge message the endpoint needs beyond the
// manager calls.

// ReleaseSession ends everything an engine connection held, after the
// endpoint declared it gone (its grace period passed with no frame, or it
// said Hello again or Bye). Every request id of the session starts with
// Prefix, which the endpoint gives each session and no other session shares.
type ReleaseSession struct {
	Prefix string   // request ids of the session start with this
	Open   []string // request ids that may still hold leases (no RequestFinished yet)
	// Session is the session's number: its slot credit (OriginCredit) is
	// freed after Quarantine.
	Session uint64
	// Quarantine keeps the session's credit and the slots of its jobs in
	// flight (pinned for a load, write-pending for a store) out of use this
	// long before they are freed: a worker of the engine may still be
	// copying out of or into them. 0 frees them at once.
	Quarantine time.Duration
	Reply      Reply[SessionReleased]
}

// Grant asks for slot credit for an engine session's stores (standalone
// mode: the engine endpoint's grant).
type Grant struct {
	Session    uint64 // the session whose credit grows
	N          int    // slots wanted
	BlockBytes int    // the session's slot size (its geometry); 0 = the pool's first
	Reply      Reply[CreditGrant]
}

// CreditGrant answers Grant.
type CreditGrant struct {
	Slots   []int // slots now in the session's credit (fewer than asked when the tier is held)
	Evicted []Key // blocks evicted to make room
}

// StoreCredited opens a store job over slots of the session's credit: the
// engine already copies into them (its scheduler did not wait).
type StoreCredited struct {
	Req     *ReqContext // the request
	Session uint64      // whose credit
	Keys    []Key       // keys, in call (chain) order
	Slots   []int       // one credited slot per key
	Reply   Reply[StoreBound]
}

// StoreBound answers StoreCredited.
type StoreBound struct {
	Job     JobID  // the store job of the bound keys; 0 when none was bound
	Bound   []bool // per key: its slot now holds its write; false: the node already holds it, the slot stays in the credit
	Workers int    // worker reports the job expects
}

// SessionReleased answers ReleaseSession. Once it is answered, every CPU-tier
// release it caused is queued ahead of any later call.
type SessionReleased struct {
	Requests int // requests whose leases were released
	Jobs     int // in-flight jobs of the session that were reaped
}
