// Package actors assembles a node's actor system: the guardian that spawns
// and supervises the tier and bridge actors, the zerolog bridge for
// protoactor's slog logger, and helpers to ask an actor or stop it from
// outside the actor system with the caller's own deadline and no blocking
// futures; and Offload, the tracked goroutines that run an actor's reads of
// slot memory off its mailbox, which the node waits for before it unmaps
// the pool.
//
// It owns the spawn tree and restart accounting, never any tier's or the
// bridge's state.
package actors
