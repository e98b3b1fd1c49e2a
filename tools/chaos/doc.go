// Package chaos is the chaos harness behind `kvtier chaos` (docs/DESIGN.md §8,
// docs/CHAOS.md): it runs a scenario — nodes with their tiers, engines
// simulated — for a duration under a seeded fault plan, lets it go quiet,
// checks the invariants kvtier promises (no leaked slot, pin, lease or
// pending write; every leased HIT loadable; no block loaded with wrong
// bytes; every call answered within its deadline; events consistent with
// final residency; goroutines and memory back to their baselines) and
// reports faults injected by kind, operations, recomputes and violations,
// with the command that reproduces the run. A violation can be shrunk to
// the smallest fault sequence that reproduces it (delta debugging over the
// recorded faults, replayed with the same seed).
//
// It owns the scenarios, the simulated engines of a run, the catalogue of
// what may be perturbed where (catalog.go), the secondary-tier fault
// wrappers and the invariant checks. Fault injection itself is
// supervision's (Injector, Ledger, Plan); the node is reached only through
// its public API and Config.Faults.
package chaos
