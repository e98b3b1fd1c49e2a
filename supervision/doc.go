// Package supervision owns the error path of the actor tree: the supervisor
// strategies every kvtier actor is spawned under, the clock that arms
// deadlines (real, or a manual clock for tests), and the per-job deadline
// timers that reap stalled transfers.
//
// It owns no tier or request state and must never reach into an actor's
// fields: it only delivers timer messages and supervisor directives.
package supervision
