// Package scheduler is the engine-facing side of a node: the bridge actor
// that serves the manager API (docs/DESIGN.md §3), the per-request state and the
// registry of engine transfer jobs with their deadlines. Out-of-process
// engines reach it through scheduler/endpoint; an embedded engine sends it
// the same messages.
//
// It owns request and job state and nothing else. It never touches slot
// metadata (the CPU tier's, asked by message) and never reads or writes
// slot bytes inside its mailbox: checksums of freshly written blocks are
// computed in a goroutine and come back as a message.
package scheduler
