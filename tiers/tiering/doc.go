// Package tiering is the actor that joins the CPU tier to the secondary
// tiers (docs/DESIGN.md §5): it cascades newly committed blocks to every
// secondary tier, answers the bridge's asynchronous lookups for CPU misses
// (RETRY while it looks, MISS once it knows), and promotes found blocks into
// CPU slots so the engine's next Lookup is a HIT.
//
// It owns the secondary lookup state (lookups in flight, the negative
// cache), the promotion and cascade jobs and their deadlines. It never
// touches slot bytes (tier workers do, under the pin or reservation it
// holds), never reads another actor's fields, and never counts as engine
// work: HasPendingWork ignores it (docs/DESIGN.md §3.1).
//
// Its decisions live in State, a core driven one message at a time that
// writes what it decided (requests, answers, deadlines) into an fx.Out:
// the actor is a shell that carries the Out out, and model_test.go drives
// the core through a seeded world instead, reading its Outs.
//
// Files: state.go (the core, its invariants, Handle), actor.go (the
// shell, the only code here that touches the actor system), config.go,
// lookup.go (asynchronous lookups, the negative cache), promote.go,
// cascade.go, replies.go (which request a CPU or tier answer belongs to)
// and stats.go.
package tiering
