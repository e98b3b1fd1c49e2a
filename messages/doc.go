// Package messages holds every type that crosses an actor boundary or the
// public API: keys, request contexts, lookup answers, events and the internal
// messages the bridge and the tiers exchange.
//
// It owns no state and starts nothing. It must never import another kvtier
// package: everything else depends on it, it depends on nothing of ours.
package messages
