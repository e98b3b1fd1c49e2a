// Package cpu is the primary tier: a fixed pool of equal-size slots in one
// shared-memory region, and the actor that alone owns its metadata — the
// index from key to slot, slot states (free, write-pending, ready), read pins,
// leases, checksums and the eviction policy.
//
// The decision logic is State, a plain struct with no goroutines and no
// clock of its own (time comes from an injected func), tested without an
// actor system. Actor wraps it and does the message plumbing. Pool is the
// mmap'ed region.
//
// The package never reads or writes slot bytes inside the actor (bulk copies
// and checksums run outside Receive), and never touches request or job state:
// that is the bridge's (package scheduler).
package cpu
