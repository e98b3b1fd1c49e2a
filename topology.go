package kvtier

import "github.com/asynkron/protoactor-go/actor"

// The node's actors live under one guardian (actors.GuardianProps), each
// named for what it is; a PID is known before anything spawns, so actors
// can be wired to each other in one pass. Spawn order, first to last (the
// guardian starts its children in this order and stops them in reverse):
//
//	events    the KV-event hub (events on)            node_events.go
//	cpu       the CPU tier                            kvtier.go
//	bridge    the manager API, request state, jobs    kvtier.go
//	endpoint  the engine endpoint (standalone)        standalone.go
//	tier-*    the secondary tiers, in config order    node_tiers.go
//	tiering   lookups, promotions, cascades           node_tiers.go
//	p2p       the P2P tier (peers on)                 node_peers.go
//	peers     the peer control plane and sessions     node_peers.go

// guardianName is the root of every actor name of the node.
const guardianName = "kvtier"

// pidOf is the PID the guardian gives its child of that name.
func (n *Node) pidOf(child string) *actor.PID {
	return actor.NewPID(n.system.Address(), guardianName+"/"+child)
}
