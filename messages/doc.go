// Package messages holds the public vocabulary — keys, request contexts,
// lookup answers, events, stats, errors — and the messages that cross
// between the engine-facing API, the tiers and the peers. A tier's private
// protocol lives beside it (the CPU tier's: tiers/cpu/cpumsg).
//
// It owns no state and starts nothing. It must never import another kvtier
// package: everything else depends on it, it depends on nothing of ours.
package messages
