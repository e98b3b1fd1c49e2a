// Package tiers is the home of kvtier's storage tiers: the CPU primary tier
// (tiers/cpu) and, as they land, the secondary tiers and the tiering actor
// that cascades to and promotes from them.
//
// Each tier owns its own index and storage and nothing else; tiers talk to
// each other and to the bridge only by messages.
package tiers
