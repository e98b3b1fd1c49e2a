// Package peer is kvtier's control plane to other kvtier nodes: one ZeroMQ
// ROUTER socket this node binds (Plane), one DEALER per remote peer it dials
// (a link), and one session actor per remote peer (Session) that runs the
// handshake, the rounds in both directions and the leases a peer's rounds
// hold in our CPU tier.
//
// It owns: the sockets (never touched outside the plane and links), the
// per-peer protocol state (epochs, rounds, tokens), the authentication of
// peers, and the per-peer counters. It never touches the CPU tier's
// metadata (it asks the CPU actor), never decides which peer to ask (the
// P2P tier does), and never moves block bytes itself (the rdma.Transport
// does, and reports completions as messages).
//
// A session's decisions are made by plain structs its tests drive alone:
// outbound.go (the handshake we start, redial back-off, heartbeat),
// gate.go (the handshake a peer starts on our ROUTER and the epoch and
// seal check of its later frames), consumer.go (the rounds we start) and
// producer.go (the rounds we serve). session.go carries their decisions
// out: sockets, timers, seals, messages to the CPU tier and the P2P tier.
//
// Peers come from the config (static) and from discovery: the node hands
// the plane a Members source (peer/discovery on etcd, behind an adapter),
// whose MemberUp and MemberDown messages open and close sessions exactly
// as a static peer's is opened. A discovered peer passes the same
// handshake and allow-list: discovery says where a node is, never who.
//
// Frames are decoded on the socket reader goroutines and delivered as
// messages to the session the moment they arrive: a peer's lookup is
// answered from the CPU tier's mailbox, never at an engine step boundary
// (docs/DESIGN.md §6.4). The wire format is peer/wire, documented in
// docs/PROTOCOL.md ("Peer protocol").
package peer
