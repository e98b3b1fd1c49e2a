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
// It is the default (KVTIERD_SCHED=normal keeps the kernel's). It was
// opt-in for a while: a CI run of the vLLM suite under it failed a test
// whose engine could not reconnect to a kvtierd sizing its slots, and a
// spinning engine beside it was suspected. The cause was the Python
// client's instead (a failed hello left its ZeroMQ monitor bound under a
// name the next socket reused); the same test failed with the default
// policy too, and passes since that fix under either.
//
// It owns only that process-wide setting; a program that embeds kvtier
// keeps its own (Open never calls it).
package schedbatch

// Env names the environment variable that chooses: KVTIERD_SCHED=normal
// keeps the kernel's default policy (unset or "batch": SCHED_BATCH).
const Env = "KVTIERD_SCHED"
