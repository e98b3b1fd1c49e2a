package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/kvtier/kvtier/tools/bench"
)

// The engine-poll scenario (`kvtier bench engine-poll`): what polling an
// engine's unix:// connection buys the engine and costs the node's peers.
const enginePollShort = "engine_poll on vs off: an out-of-process engine's Lookups in bursts and a peer's lookups the node answers meanwhile"

func printEnginePoll(o bench.EnginePollOptions, r bench.EnginePollResult) {
	fmt.Printf("engine: %d back-to-back %d-key Lookups per step, %v between steps; a peer's lookups %v apart; %d rounds per setting, medians\n",
		o.BurstCalls, o.BurstKeys, o.StepGap, o.ProbeGap, r.Rounds)
	for _, s := range []bench.EnginePollSide{r.Off, r.On} {
		fmt.Printf("engine_poll %4.0f µs: engine Lookup p50 %.1f µs p99 %.1f µs; peer lookup p50 %.0f µs p99 %.0f µs (engine idle: p50 %.0f µs)\n",
			s.PollUs, s.EngineLookupP50us, s.EngineLookupP99us, s.PeerLookupP50us, s.PeerLookupP99us, s.IdlePeerLookupP50us)
	}
	fmt.Printf("engine p50 speedup %.2f×; peer p50 %.2f×, p99 %.2f× on over off → default %s\n",
		r.EngineSpeedup, r.PeerP50Ratio, r.PeerP99Ratio, r.Verdict)
}

func enginePollFlags(f *pflag.FlagSet, o *bench.EnginePollOptions) {
	f.DurationVar(&o.Poll, "poll", o.Poll, "the polled setting's engine_poll window")
	f.IntVar(&o.Rounds, "rounds", o.Rounds, "measurement rounds per setting (alternating)")
	f.IntVar(&o.Probes, "probes", o.Probes, "peer lookups timed per round")
	f.DurationVar(&o.ProbeGap, "probe-gap", o.ProbeGap, "idle time before each peer lookup")
	f.IntVar(&o.BurstCalls, "burst-calls", o.BurstCalls, "the engine's back-to-back Lookups per step")
	f.IntVar(&o.BurstKeys, "keys", o.BurstKeys, "keys per Lookup")
	f.DurationVar(&o.StepGap, "step-gap", o.StepGap, "the engine's idle time between bursts")
	poolFlags(f, &o.Slots, &o.BlockBytes, "pool slots of every node")
	timeoutFlag(f, &o.Timeout)
}
