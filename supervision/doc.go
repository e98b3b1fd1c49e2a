// Package supervision owns what the actor tree's error path needs from
// outside any actor: the clock that arms deadlines (real, a manual clock
// for tests, a jumping clock for the simulator: clock.go, jumpclock.go) and
// fault injection — receiver middleware that turns an InjectPanic or an
// attached Injector's rules into panics, drops, delays, duplicates and
// reorders (faults.go, inject.go, rules.go), plans that decide by point so
// a replay meets the same faults (plan.go), and the Ledger every fault
// wrapper counts into (ledger.go).
//
// The supervisor strategies actors are spawned under and the per-job
// deadline timers live with their owners (actors/guardian.go, the bridge's
// jobs in scheduler/jobs.go). This package owns no tier or request state
// and never reaches into an actor's fields: it delivers timer messages and
// injected faults only.
package supervision
