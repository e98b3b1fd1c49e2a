package chaos

import (
	"fmt"
	"strings"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/peer/peermsg"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
	"github.com/kvtier/kvtier/tiers/tiering/tieringmsg"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

// The message catalogue: which messages, delivered to which actor, may be
// perturbed in which way. A fault is in the catalogue only when the
// system is designed to survive it — when the loss, lateness or repetition
// of that message is something a deadline, a lease, a correlation id or an
// idempotent handler already absorbs. Everything else (the CPU tier's slot
// protocol, I/O completions that release slot memory, events to the hub)
// relies on what a local mailbox guarantees — exactly-once, FIFO per
// sender — and is never perturbed: breaking it would test a property the
// design does not claim. (The self-tests break it on purpose, through
// Hooks.UnsafeRules, to prove the invariants notice.)
//
// Every actor below may also be made to panic after any message it
// handles (supervision.FaultPanic): docs/DESIGN.md §2.4 claims a restart
// from any point between two messages.
//
// docs/CHAOS.md carries the same table with the reasoning.

// Message fault sets.
var (
	// A boundary call: the engine awaits it with its own deadline (a lossy
	// transport in standalone mode). Lost: the call times out, and what it
	// would have started is undone by lease expiry or job reaping. Late or
	// repeated: handlers are idempotent per request and job (a second
	// PrepareLoad finds the lease consumed, a second JobDone is a late
	// report).
	anyFault = []Kind{supervision.FaultDrop, supervision.FaultDelay, supervision.FaultDuplicate, supervision.FaultReorder}
	// Late or reordered but exactly once: answers matched by correlation id
	// whose requester has no deadline for them, and I/O requests whose
	// completion releases slot memory (a lost tiermsg.Read would keep a
	// promotion's slots reserved forever; a duplicate one would let a
	// worker write into a slot after its job released it).
	lateOnly = []Kind{supervision.FaultDelay, supervision.FaultReorder}
	// Late, reordered or repeated, never lost: answers matched by
	// correlation id (a repeat finds nothing pending and is ignored) whose
	// requester has no deadline for them.
	noLoss = []Kind{supervision.FaultDelay, supervision.FaultDuplicate, supervision.FaultReorder}
	// A drain: lost or late is harmless (the next call drains), but a
	// duplicate would drain twice into one reply and lose the second batch.
	noDup = []Kind{supervision.FaultDrop, supervision.FaultDelay, supervision.FaultReorder}
)

// catalogue maps "actor type" (the actor's name under the guardian, "tier-*"
// for every secondary tier) to the message faults allowed there.
var catalogue = map[string][]Kind{}

func allow(actorName string, kinds []Kind, msgs ...any) {
	for _, m := range msgs {
		catalogue[actorName+" "+fmt.Sprintf("%T", m)] = kinds
	}
}

// allowTypes is allow for types named as %T prints them (the peer
// session's own, unexported, messages).
func allowTypes(actorName string, kinds []Kind, types ...string) {
	for _, t := range types {
		catalogue[actorName+" "+t] = kinds
	}
}

func init() {
	// The bridge: engine calls at the boundary.
	allow("bridge", anyFault, (*messages.Lookup)(nil), (*messages.PrepareLoad)(nil), (*messages.Touch)(nil),
		(*messages.CompleteLoad)(nil), (*messages.PrepareStore)(nil), (*messages.CompleteStore)(nil),
		(*messages.JobDone)(nil), (*messages.RequestFinished)(nil))
	allow("bridge", noDup, (*messages.TakeEvents)(nil))
	// The tiering actor's answer to a MISS: the engine's Lookup waits on it
	// (a loss would be an unanswered call), a repeat is ignored by corr.
	allow("bridge", noLoss, (*tieringmsg.AsyncLookupResult)(nil))

	// The CPU tier: recency hints only. Its slot protocol (Reserve, Commit,
	// LeaseToPin, Unpin, Release*) is the owner of record's and relies on
	// exactly-once FIFO delivery from each sender.
	allow("cpu", anyFault, (*cpumsg.TouchKeys)(nil))

	// The tiering actor. Tier lookup answers are covered by the lookup
	// deadline; a cascade is best effort (a lost one is a block not copied
	// down, as when the queue sheds it). Answers whose loss would strand a
	// job holding slots are never dropped.
	allow("tiering", anyFault, (*tiermsg.LookupResult)(nil), (*tieringmsg.Cascade)(nil))
	allow("tiering", noLoss, (*tieringmsg.AsyncLookup)(nil), (*tiermsg.ReadResult)(nil),
		(*tiermsg.WriteResult)(nil), (*cpumsg.ReserveResult)(nil), (*cpumsg.PinResult)(nil),
		(*messages.Ack)(nil), (*tiermsg.StatsReply)(nil))

	// Secondary tiers. A lost lookup is the lookup deadline's; a lost
	// delete leaves a bad copy that fails its checksum on the next read.
	allow("tier-*", anyFault, (*tiermsg.Lookup)(nil), (*tiermsg.Delete)(nil))
	allow("tier-*", noLoss, (*tiermsg.StatsQuery)(nil))
	allow("tier-*", lateOnly, (*tiermsg.Read)(nil), (*tiermsg.Write)(nil))

	// The P2P tier. A lost tiermsg.Lookup is the tiering actor's lookup
	// deadline's. A session's answers are matched by corr (a repeat finds
	// nothing pending) but never lost: a peermsg.Lookup or peermsg.Fetch entry
	// would stay forever, and a lost fetch answer strands the promotion's
	// slots. A read batch is an I/O request: exactly once.
	allow("p2p", anyFault, (*tiermsg.Lookup)(nil))
	allow("p2p", noLoss, (*peermsg.LookupResult)(nil), (*peermsg.FetchResult)(nil),
		(*tiermsg.StatsQuery)(nil))
	allow("p2p", lateOnly, (*tiermsg.ReadBatch)(nil))

	// A peer session (peer/session.go). Wire frames in either direction
	// are a network's: lost, late or repeated, they are absorbed by the
	// round deadlines (a lost LookupResp or TransferDone is the round
	// timer's, a lost Fetch the fetch deadline's and then the producer's
	// lease TTL), the handshake deadline and the heartbeat, and a frame of
	// another epoch or for a finished round is dropped. The P2P tier's
	// requests are answered exactly once by the session, so they are late
	// at most (a duplicate peermsg.Lookup would lease a round nobody releases
	// but the TTL). A peermsg.Release lost leaves the lease to its TTL. The
	// data plane's completions (arrived, verified, written) and the CPU
	// tier's answers to a producer round (LookupResult, PinResult) release
	// slots, pins and leases, or answer a fetch: exactly once, late at
	// most.
	allowTypes("session", anyFault, "*peer.inboundFrame", "*peer.outboundFrame")
	allow("session", lateOnly, (*peermsg.Lookup)(nil), (*peermsg.Fetch)(nil),
		(*cpumsg.LookupResult)(nil), (*cpumsg.PinResult)(nil))
	allow("session", anyFault, (*peermsg.Release)(nil))
	allowTypes("session", lateOnly, "*peer.arrived", "*peer.verified", "*peer.written")
}

// panicTargets are the actors that may be made to panic. A peer session
// answers its rounds and releases its producer rounds when it restarts
// (Session.cleanup); the P2P tier is not among them: its lookups, fetches
// and held rounds die with the actor (a read batch in flight would never
// be answered), and the peer control plane's restart stops its sessions.
var panicTargets = []string{"bridge", "cpu", "tiering", "tier-*", "events", "session"}

// actorName turns a PID id ("kvtier/tier-fs", with any scenario prefix)
// into its catalogue name ("tier-*", "session" for "kvtier/peers/peer-n1").
func actorName(target string) string {
	name := target[strings.LastIndexByte(target, '/')+1:]
	switch {
	case strings.HasPrefix(name, "tier-"):
		return "tier-*"
	case strings.HasPrefix(name, "peer-") && strings.Contains(target, "/peers/"):
		return "session"
	}
	return name
}

// Allowed returns the message faults the catalogue allows for a message of
// type typ delivered to target (panic included where the actor may fail).
func Allowed(target, typ string) []Kind {
	name := actorName(target)
	kinds := catalogue[name+" "+typ]
	for _, p := range panicTargets {
		if p == name {
			return append(kinds[:len(kinds):len(kinds)], supervision.FaultPanic)
		}
	}
	return kinds
}

// engineCallTypes maps the bridge's engine-call message types to the
// manager call names the engine counts them under.
var engineCallTypes = map[string]string{
	fmt.Sprintf("%T", (*messages.Lookup)(nil)):          callLookup,
	fmt.Sprintf("%T", (*messages.PrepareLoad)(nil)):     callPrepareLoad,
	fmt.Sprintf("%T", (*messages.Touch)(nil)):           callTouch,
	fmt.Sprintf("%T", (*messages.CompleteLoad)(nil)):    callCompleteLoad,
	fmt.Sprintf("%T", (*messages.PrepareStore)(nil)):    callPrepareStore,
	fmt.Sprintf("%T", (*messages.CompleteStore)(nil)):   callCompleteStore,
	fmt.Sprintf("%T", (*messages.JobDone)(nil)):         callJobDone,
	fmt.Sprintf("%T", (*messages.RequestFinished)(nil)): callRequestFinished,
	fmt.Sprintf("%T", (*messages.TakeEvents)(nil)):      callTakeEvents,
}
