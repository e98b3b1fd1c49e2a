// Package schedbatch puts kvtier's own processes (kvtierd) under Linux's
// SCHED_BATCH policy.
//
// Why: kvtierd shares a node's cores with the engines it serves, and most
// of an engine's calls wake one of its threads (the socket's reader, the
// actors behind it). Under the default policy a thread that wakes up
// preempts the thread running on that core when it has slept long enough,
// and the thread running there is usually the engine's scheduler that just
// sent the call: its sendall then returns only once kvtierd's thread
// yields. In the manager bench on two cores (vLLM's scheduler driving
// kvtier_vllm over unix://) the engine spent ~250 ms of a run in sendall,
// its p99 ~0.8 ms; under SCHED_BATCH, which keeps a woken thread from
// preempting the running one but leaves its share of the CPU as it was,
// ~25 ms and 35 µs (docs/PERFORMANCE.md, issue 43 round 4). A call the
// engine waits on is no slower: the engine's thread then sleeps, and
// kvtierd's runs at once.
//
// It is opt-in (KVTIERD_SCHED=batch), because the same rule cuts the
// other way beside an engine whose threads spin on the CPU (vLLM's CPU
// build, OpenMP): each wake-up of a kvtierd thread then waits out a
// spinning thread's slice, and in one CI run of the vLLM suite an engine
// whose kvtierd ran under SCHED_BATCH could not finish its hello for 60 s
// (test_a_kvtierd_with_no_block_size_takes_the_engines[ipc]); the cause
// was not proven, and the default stays the kernel's until it is.
//
// It owns only that process-wide setting; a program that embeds kvtier
// keeps its own (Open never calls it).
package schedbatch

// Env names the environment variable that turns it on: KVTIERD_SCHED=batch
// (unset or "normal": the default policy).
const Env = "KVTIERD_SCHED"
