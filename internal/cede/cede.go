// Package cede lets a long CPU-bound loop of the node hand its core back to
// the kernel's run queue at intervals of work done.
//
// Why: the node's goroutines hand work to each other on one OS thread
// (protoactor's mailboxes, the bridge's checksum goroutine), so a step
// boundary of an engine's calls can keep one thread on a core for
// milliseconds without ever blocking. A thread the kernel wakes meanwhile
// (the network poller with a peer's lookup) may be queued on that core and
// wait for the next scheduler tick: 4 ms on a 250 Hz kernel, measured on a
// 2-vCPU VM as peer lookups answered 3-4 ms late at every boundary. A
// Budget cedes the core (sched_yield on Linux) once its loop has handled
// Every bytes since the last time; with nobody waiting, that costs one
// system call. Measured (docs/PERFORMANCE.md, issue 17 round 4, "the
// commit checksum cedes its core"): store-to-peer-visible p50 0.6 ms
// against 1.6-2.0 ms without a yield and 2.25 ms with runtime.Gosched (a
// Go-level yield leaves the core to the same thread), for an engine step
// boundary of ~8 ms instead of ~4 ms while a peer looks up back to back.
//
// It owns no state beyond one loop's count, never goroutines or locks.
package cede

// DefaultEvery is the work between two yields: 512 KiB checksummed takes
// ~50 µs at memory speed, so a peer's lookup queued behind the loop waits
// about that long rather than a tick, for one system call per 512 KiB
// (under 1 % of the checksum's own time).
const DefaultEvery = 512 << 10

// Budget counts one loop's bytes; the zero value yields every
// DefaultEvery bytes.
type Budget struct {
	Every int // bytes between yields; <= 0: DefaultEvery
	done  int
}

// Spent records n bytes of work and yields when Every bytes have been done
// since the last yield.
func (b *Budget) Spent(n int) {
	every := b.Every
	if every <= 0 {
		every = DefaultEvery
	}
	if b.done += n; b.done >= every {
		b.done = 0
		yield()
	}
}
