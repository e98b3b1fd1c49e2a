// Package tieringmsg is the tiering actor's protocol (tiers/tiering): the
// bridge's asynchronous lookups and cascades, the P2P tier's refresh, and
// the node's idle and stats queries.
//
// It owns the message types only: the tiering actor owns its logic, and
// the public vocabulary (keys, contexts, lookup statuses, stats) is
// messages'.
package tieringmsg

import (
	"github.com/kvtier/kvtier/messages"
)

// Message is a message of this protocol (sealed: only this package's
// types are).
type Message interface{ tieringMessage() }

func (*TierRefreshed) tieringMessage()     {}
func (*AsyncLookup) tieringMessage()       {}
func (*AsyncLookupResult) tieringMessage() {}
func (*Cascade) tieringMessage()           {}
func (*Idle) tieringMessage()              {}
func (*GetStats) tieringMessage()          {}

// TierRefreshed tells the tiering actor that a tier may now hold blocks it
// answered absent before (the P2P tier: a peer's session came up — a new
// member, or one restarted with its data), so the absences cached from its
// answers are dropped and the next lookups ask it again.
type TierRefreshed struct {
	Tier string // the tier's name
}

// AsyncLookup asks the tiering actor about keys the CPU tier answered MISS
// for. It answers at once: RETRY for keys whose secondary lookup or
// promotion is in flight (or was just started), MISS for keys known absent
// from every tier Req may load from, or whose lookup passed its deadline.
type AsyncLookup struct {
	Corr   uint64
	Req    *messages.ReqContext // the request (its TierFilter, and provenance for the stored event)
	Keys   []messages.Key       // the CPU tier's MISS keys, in prefix order
	Prefix bool                 // keys are the tail of a prefix scan: promote only a found prefix
}

// AsyncLookupResult answers AsyncLookup: Retry or Miss per key.
type AsyncLookupResult struct {
	Corr   uint64
	Status []messages.LookupStatus
}

// Cascade tells the tiering actor that Keys became readable in the CPU tier
// (a successful store commit) with Checksums. Fire and forget: the tiering
// actor pins, writes and unpins on its own, shedding past its queue bound.
type Cascade struct {
	Keys      []messages.Key
	Checksums []uint32
	Ctx       *messages.ReqContext
}

// Idle asks to be answered once the tiering actor has no lookup,
// promotion or cascade in flight (answered at once when idle). For
// simulators and tests that need a settled node; the engine never waits.
type Idle struct {
	Reply messages.Reply[struct{}]
}

// GetStats asks the tiering actor for its counters and every
// secondary tier's.
type GetStats struct {
	Reply messages.Reply[messages.TieringStats]
}
