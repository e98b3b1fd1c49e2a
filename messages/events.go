package messages

import "time"

// EventKind says what happened to blocks in a tier this node owns.
type EventKind uint8

const (
	BlockStored      EventKind = iota + 1 // blocks became readable
	BlockRemoved                          // blocks went away (evicted, cleared one by one)
	AllBlocksCleared                      // the whole tier was cleared

	// Notes for the node's event hub only: never published, never in a
	// tier's TakeTierEvents buffer. They let the hub announce a block's
	// parent before the block when the parent's write (in the same medium)
	// is still in flight as the block lands.
	BlockWriting      // a write of Keys started in the tier (not readable yet)
	BlockWriteAborted // writes of Keys ended without the blocks becoming readable
)

func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	case BlockWriting:
		return "BlockWriting"
	case BlockWriteAborted:
		return "BlockWriteAborted"
	}
	return "Unknown"
}

// Medium names the storage an event is about (vLLM's `medium` field).
const (
	MediumCPU     = "CPU"
	MediumStorage = "STORAGE"
)

// EngineTopic tells the event hub the topic an engine's own KV events go
// out under (its hello said so), and the key namespace of its blocks: the
// hub announces the blocks of that namespace under that topic, so a router
// that credits pods by topic credits every engine that can load them. Gone
// says the engine's session ended (Namespace and Topic are then unused).
type EngineTopic struct {
	Session   uint64    // the endpoint's session id
	Namespace Namespace // the namespace of the engine's keys
	Topic     string    // the topic of the engine's own KV events
	Gone      bool      // the session ended
}

// Event is a tier event. Stored events carry the request context of the job
// that produced them (nil only when the producer had none, e.g. a peer that
// sent no provenance).
type Event struct {
	Kind   EventKind   // what happened
	Keys   []Key       // the blocks, in chain order for stored events
	Medium string      // MediumCPU or MediumStorage
	Ctx    *ReqContext // the producing job's context (stored events only)
	At     time.Time   // when the tier applied it
	// Place locates each of Keys in the call Ctx describes (stored events
	// only; one per key; nil when the producer did not know).
	Place []Placement
	// Prov is each key's provenance where the producer had it without a
	// call to place it in (a promotion from a stored header, a peer's
	// answer): stored events only; nil, or one per key, a nil entry falling
	// back to Ctx and Place.
	Prov []*Provenance
	// Ownership names the tier within its medium that holds the blocks
	// ("" for the CPU tier; e.g. "fs" or "obj" for STORAGE). Copies are
	// counted per (Medium, Ownership): a block is removed from a medium
	// only when its last copy there goes away.
	Ownership string
	// Locality is "LOCAL" or "REMOTE" relative to this node for tiers that
	// can be either (a shared filesystem); "" when not applicable.
	Locality string
}
