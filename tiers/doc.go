// Package tiers is the home of kvtier's storage tiers: the CPU primary tier
// (tiers/cpu), the secondary tiers — a local filesystem (tiers/fs), an S3
// object store (tiers/obj) and peers (tiers/p2p) — and the tiering actor
// (tiers/tiering) that cascades blocks to them and promotes them back;
// tiers/blockfmt is the on-disk and on-wire block format they share,
// tiers/tiertest the contract tests every secondary tier passes.
//
// Each tier owns its own index and storage and nothing else; tiers talk to
// each other and to the bridge only by messages.
package tiers
