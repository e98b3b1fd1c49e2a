// Package p2p is the tier face of kvtier's peers: it answers the tiering
// actor's secondary-tier contract (tiers/contract.go) by asking the peer
// sessions (peer/) concurrently, taking the first peer that holds each key,
// and fetching a whole promotion from each peer in one round
// (tiermsg.ReadBatch).
//
// It owns which peer a key is fetched from and how long an unused lookup
// lease is held. It never touches sockets, the data plane or slot memory
// (the sessions and the transport do), and never the CPU tier's state.
//
// Its decisions live in State, a core driven one message at a time that
// writes what it decided (requests to sessions, answers, deadlines, event
// watchers to start and stop) into an Out, an fx.Out with the watchers
// added: Tier, the actor, is a shell that carries the Out out, and
// model_test.go drives the core through a seeded world instead, reading
// its Outs.
//
// Files: tier.go (the config, the core, its invariants, Handle, lookups,
// reads and probes), watch.go (which peers' event streams the core
// follows), directory.go (which peer holds which block), actor.go (the
// shell, the only code here that touches the actor system: it runs the
// watcher goroutines).
package p2p
