// Package sim is the engine simulator behind `kvtier sim`: it drives a
// kvtier.Manager exactly as an inference engine's scheduler would, one step
// at a time, on a virtual clock. Each request makes vLLM's calls in vLLM's
// order: Lookup after its GPU prefix (again after a RETRY or HIT_PENDING
// step), PrepareLoad of its leading HITs, PrepareStore of the blocks after
// its load (the whole prompt when it loaded nothing), one Touch of every key
// it loaded or offered, tail first, and RequestFinished. It owns the simulated engine — a GPU block
// cache with its own LRU, the request workload (synthetic or a Mooncake
// trace), the transfer workers that copy block bytes in and out of slots and
// report per worker, and the summary of a run. The engine's parts — keys and
// block bytes, each worker's shard, the GPU cache, request phases and
// contexts, how a lookup's answer is read — are exported: the chaos
// harness's wall-clock engine (tools/chaos) is built on them.
//
// It depends only on the kvtier.Manager interface, so the embedded node and a
// standalone client are driven by the same code. It must not touch the node's
// internals (tiers, bridge, actors) nor start goroutines: the driver is a
// single engine scheduler thread, and time is the virtual clock, never the
// wall clock (except for measuring call latency and the optional realtime
// pacing).
package sim
