package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/kvtier/kvtier/tools/bench"
)

const fleetShort = "N nodes finding each other in etcd, a shared workload on random nodes: the peer directory against asking every peer"

func fleetFlags(f *pflag.FlagSet, o *bench.FleetOptions) {
	f.IntVar(&o.Nodes, "nodes", o.Nodes, "nodes in the fleet (one process)")
	poolFlags(f, &o.Slots, &o.BlockBytes, "CPU slots per node")
	f.IntVar(&o.Requests, "requests", o.Requests, "requests, each a turn on a random node")
	f.DurationVar(&o.ThinkTime, "think-time", o.ThinkTime, "a conversation's next turn comes no sooner after its last")
	f.Uint64Var(&o.Seed, "seed", o.Seed, "workload seed")
	f.StringVar(&o.Etcd, "etcd", o.Etcd, "the etcd binary (default: etcd on PATH, or /usr/bin/etcd)")
	timeoutFlag(f, &o.Timeout)
}

func printFleet(_ bench.FleetOptions, r bench.FleetResult) {
	fmt.Printf("%d nodes converged (every node a session to every other) in %.2f s\n", r.Nodes, r.ConvergeS)
	fmt.Printf("%d requests, %d blocks looked up\n", r.Requests, r.BlocksLookedUp)
	fmt.Printf("PeerLookups per miss: directory %.2f, ask-all %.2f\n", r.MessagesPerMiss, r.AskAllMessagesPerMiss)
	fmt.Printf("peer hit rate (blocks found on a peer / blocks not local): directory %.4f, ask-all %.4f\n", r.PeerHitRate, r.AskAllPeerHitRate)
	fmt.Printf("lookup until settled: directory p50 %.0f µs p99 %.0f µs; ask-all p50 %.0f µs p99 %.0f µs\n",
		r.LookupP50us, r.LookupP99us, r.AskAllLookupP50us, r.AskAllLookupP99us)
	fmt.Printf("directory: %.0f bytes per node; idle fleet: %.0f context switches/s\n", r.DirectoryBytesPerNode, r.IdleCtxswPerS)
}
