// Package messages holds the public vocabulary — keys, request contexts,
// lookup answers, events, stats, errors — and the engine-facing API's
// messages. Every actor's private protocol lives beside it: the CPU tier's
// in tiers/cpu/cpumsg, the secondary-tier contract in tiers/tiermsg, the
// tiering actor's in tiers/tiering/tieringmsg, the peers' in peer/peermsg.
//
// One request/reply rule, by who asks:
//   - a caller outside the actors (the engine API, the endpoint's call
//     goroutines, the node's queries: FlushEvents, Inventory, VerifyBlock)
//     puts a Reply[T] in its message and waits on it with its own deadline;
//     the actor answers it exactly once, never blocking (Answer);
//   - an actor asking another sends a message with a correlation id
//     (Corr) and goes on; the answer comes back to its mailbox as a message
//     with that id, matched to a typed record of what it was for, so
//     nothing inside Receive ever waits.
//
// No blocking futures anywhere; actors.Ask only stands in for an asking
// actor in tests.
//
// It owns no state and starts nothing. It must never import another kvtier
// package: everything else depends on it, it depends on nothing of ours.
package messages
