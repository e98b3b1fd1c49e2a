// Package messages holds the public vocabulary — keys, request contexts,
// lookup answers, events, stats, errors — and the engine-facing API's
// messages. Every actor's private protocol lives beside it: the CPU tier's
// in tiers/cpu/cpumsg, the secondary-tier contract in tiers/tiermsg, the
// tiering actor's in tiers/tiering/tieringmsg, the peers' in peer/peermsg.
//
// It owns no state and starts nothing. It must never import another kvtier
// package: everything else depends on it, it depends on nothing of ours.
package messages
