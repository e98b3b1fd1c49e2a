package peer

import "github.com/asynkron/protoactor-go/actor"

// What a session tells the P2P tier (tiers/p2p) about itself: the only
// messages of peer/ that carry an actor PID, so they live here rather than
// in messages/ (which the engine client imports).

// Up tells the P2P tier that a session with Node can serve rounds.
type Up struct {
	Node    string
	Session *actor.PID // the session actor
	Epoch   uint64     // the outbound session's epoch
}

// Down tells the P2P tier that a session stopped serving rounds (its
// in-flight rounds are answered with errors by the session itself).
type Down struct {
	Node    string
	Session *actor.PID
	Epoch   uint64
	Reason  string
}

// EventsAt tells the P2P tier where a peer publishes its KV events, so that
// its directory follows them (tiers/p2p/watch.go). The plane sends it for
// every static peer and discovered member whose event addresses it knows;
// a later one replaces the addresses.
type EventsAt struct {
	Node     string // the peer's node id
	Endpoint string // its PUB address
	Replay   string // its replay ROUTER address ("" = none)
}
