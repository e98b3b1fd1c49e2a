// Package nixl is kvtier's RDMA data plane over NVIDIA's NIXL transfer
// library (the one vLLM, SGLang and Dynamo use), implementing
// rdma.Transport one call to one NIXL call:
//
//	Register   -> one DRAM registration of the whole CPU pool
//	Metadata   -> a versioned envelope around the agent's local metadata
//	Connect    -> load the remote agent's metadata, prepare its slot list once
//	Write      -> one NIXL WRITE request, local slots into remote slots,
//	              posted with a notification that carries the token
//	Expect     -> completes when that notification arrives
//
// Limit: the remote pool is registered as slots of one fixed size, so
// Connect refuses a peer whose slot size differs from ours, and a Write
// moves whole slots whatever its blocks' lengths (a block shorter than its
// slot carries the slot's tail along; the lengths are checked against the
// slot size and counted in Completion.Bytes). Peers whose pools differ in
// slot size exchange blocks over rdma/tcp only.
//
// The package owns the NIXL agent, its UCX backend, the registration of the
// pool and the in-flight transfer requests. It never decides what to move.
//
// Build: with `-tags nixl` and cgo the real transport is compiled; it loads
// libnixl_capi.so at run time with dlopen (Config.Library, else
// $KVTIER_NIXL_LIB, else the dynamic loader's search path), so neither the
// build nor `go vet` needs NIXL or its headers: the few C functions used are
// declared here, against the C API of NIXL 1.x (tested with 0.10.1, 1.0.0,
// 1.4.1 and 1.5.1). Without the tag (or without cgo) New returns an error
// wrapping rdma.ErrUnavailable, and the rest of kvtier builds with no C
// library.
//
// Threads: NIXL's default thread mode has no locking and UCX binds a worker
// to the thread that first drives it, so every call for one agent is made
// by one goroutine locked to its OS thread (runtime.LockOSThread), fed by a
// mailbox. That goroutine drives UCX progress itself (the agent is created
// without NIXL's progress thread) and only while something is in flight:
// an idle transport makes no wakeups. Completion callbacks run on a second
// goroutine, never on the locked one, so they may call back into the
// transport.
//
// docs/NIXL.md has the operator's view and the design decisions (the
// completion signal, the wait strategy and its cost, and what a Cancel can
// and cannot guarantee against a late remote write).
package nixl
