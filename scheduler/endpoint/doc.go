// Package endpoint is the engine endpoint of a standalone node: it serves
// the manager API to out-of-process engines over a unix:// stream socket
// or a ZeroMQ ROUTER (docs/PROTOCOL.md), decoding each frame with
// scheduler/wire off any mailbox and forwarding the call to the bridge
// actor (scheduler) as the same message an embedded engine sends.
//
// Its decisions are a plain struct, the session table (sessions.go: who
// is connected, what each holds open, its calls in flight, its liveness
// deadline and its release), which sessions_test.go drives alone; the
// actor (actor.go) carries them out.
//
// It owns the engine sessions (their liveness, and releasing what a lost
// one held, through the bridge) and the sockets. It never holds request
// or job state (the bridge's) and never touches slot memory.
package endpoint
