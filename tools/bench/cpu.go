package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/cpu"
)

// CPUOptions sizes the CPU-tier scenario.
type CPUOptions struct {
	Slots       int           // pool slots
	BlockBytes  int           // bytes per slot
	LookupKeys  int           // keys per Lookup (2,000 in the target)
	Lookups     int           // Lookup calls measured
	StoreBatch  int           // keys per PrepareStore
	StoreRounds int           // PrepareStore calls measured (each evicts StoreBatch)
	Policy      string        // eviction policy
	Timeout     time.Duration // whole-run bound
}

// DefaultCPUOptions is what `kvtier bench cpu` runs with no flags.
func DefaultCPUOptions() CPUOptions {
	return CPUOptions{Slots: 16384, BlockBytes: 4096, LookupKeys: 2000, Lookups: 300,
		StoreBatch: 16, StoreRounds: 2000, Policy: "lru", Timeout: 5 * time.Minute}
}

// CPUResult is the scenario's report.
type CPUResult struct {
	LookupP50us         float64 `json:"lookup_2000_p50_us"`
	LookupP99us         float64 `json:"lookup_2000_p99_us"`
	KeyLookupsPerS      float64 `json:"key_lookups_per_s"`
	StoresPerS          float64 `json:"stores_per_s"`
	BareLookupP50us     float64 `json:"bare_lookup_2000_p50_us"`
	BareKeyLookupsPerS  float64 `json:"bare_key_lookups_per_s"`
	BareStoresPerS      float64 `json:"bare_stores_per_s"`
	LookupActorOverhead float64 `json:"lookup_actor_overhead"` // bare ÷ actor key lookups/s
	StoreActorOverhead  float64 `json:"store_actor_overhead"`  // bare ÷ actor stores/s
	LookupKeys          int     `json:"lookup_keys"`
	Lookups             int     `json:"lookups"`
	StoreBatch          int     `json:"store_batch"`
	StoreRounds         int     `json:"store_rounds"`
	Slots               int     `json:"slots"`
	BlockBytes          int     `json:"block_bytes"`
}

var benchNS = messages.Layout{Model: "bench", DType: "fp16", BlockTokens: 16, TPSize: 1}.Namespace()

func benchKey(i int) messages.Key { return numberedKey(benchNS, i) }

// numberedKey is the bench's key number i in namespace ns: a 32-byte hash
// (an engine's size) holding i big-endian, so a run's keys are distinct and
// the same from run to run. The scenarios' keys all come from it.
func numberedKey(ns messages.Namespace, i int) messages.Key {
	var b [32]byte
	binary.BigEndian.PutUint64(b[:], uint64(i))
	return messages.Key{Namespace: ns, Hash: string(b[:])}
}

func keyRange(from, n int) []messages.Key {
	out := make([]messages.Key, n)
	for i := range out {
		out[i] = benchKey(from + i)
	}
	return out
}

// RunCPU measures Lookup and PrepareStore through an embedded node, then the
// same operations on a bare cpu.State, in one run.
func RunCPU(ctx context.Context, o CPUOptions) (CPUResult, error) {
	if o.LookupKeys > o.Slots || o.StoreBatch > o.Slots {
		return CPUResult{}, fmt.Errorf("%w: %d lookup keys / %d batch exceed %d slots", messages.ErrBadConfig, o.LookupKeys, o.StoreBatch, o.Slots)
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	res := CPUResult{LookupKeys: o.LookupKeys, Lookups: o.Lookups, StoreBatch: o.StoreBatch,
		StoreRounds: o.StoreRounds, Slots: o.Slots, BlockBytes: o.BlockBytes}
	if err := runActorPath(ctx, o, &res); err != nil {
		return res, err
	}
	if err := runBare(o, &res); err != nil {
		return res, err
	}
	res.LookupActorOverhead = res.BareKeyLookupsPerS / res.KeyLookupsPerS
	res.StoreActorOverhead = res.BareStoresPerS / res.StoresPerS
	return res, nil
}

func runActorPath(ctx context.Context, o CPUOptions, res *CPUResult) error {
	node, err := kvtier.Open(ctx, kvtier.Config{PoolBytes: int64(o.Slots) * int64(o.BlockBytes), BlockBytes: o.BlockBytes, Policy: o.Policy})
	if err != nil {
		return err
	}
	defer node.Close(ctx)
	m := node.Manager()

	if err := fillPool(ctx, m, o.Slots); err != nil {
		return err
	}
	keys := keyRange(0, o.LookupKeys)
	lat := make([]time.Duration, 0, o.Lookups)
	var total time.Duration
	for i := range o.Lookups {
		req := &messages.ReqContext{RequestID: fmt.Sprintf("l%d", i)}
		start := time.Now()
		st, err := m.Lookup(ctx, req, keys, true)
		d := time.Since(start)
		if err != nil {
			return err
		}
		if st[len(st)-1] != messages.Hit {
			return fmt.Errorf("bench lookup: key %d is %v, want HIT", len(st)-1, st[len(st)-1])
		}
		lat, total = append(lat, d), total+d
		if err := m.RequestFinished(ctx, req); err != nil {
			return err
		}
	}
	res.LookupP50us, res.LookupP99us = percentileUs(lat, 0.50), percentileUs(lat, 0.99)
	res.KeyLookupsPerS = float64(o.Lookups*o.LookupKeys) / total.Seconds()

	next := o.Slots
	start := time.Now()
	for range o.StoreRounds {
		req := &messages.ReqContext{RequestID: "s"}
		plan, err := m.PrepareStore(ctx, req, keyRange(next, o.StoreBatch))
		if err != nil {
			return err
		}
		if len(plan.Evicted) != o.StoreBatch {
			return fmt.Errorf("bench store: evicted %d, want %d", len(plan.Evicted), o.StoreBatch)
		}
		if err := m.JobDone(ctx, plan.Job, 0, true); err != nil {
			return err
		}
		next += o.StoreBatch
	}
	// The last commits land off the mailbox: wait for them inside the timing.
	if err := settle(ctx, m); err != nil {
		return err
	}
	res.StoresPerS = float64(o.StoreRounds*o.StoreBatch) / time.Since(start).Seconds()
	return nil
}

// fillPool stores `slots` blocks so every later store evicts.
func fillPool(ctx context.Context, m kvtier.Manager, slots int) error {
	const batch = 256
	req := &messages.ReqContext{RequestID: "fill"}
	for from := 0; from < slots; from += batch {
		plan, err := m.PrepareStore(ctx, req, keyRange(from, min(batch, slots-from)))
		if err != nil {
			return err
		}
		if err := m.JobDone(ctx, plan.Job, 0, true); err != nil {
			return err
		}
	}
	return settle(ctx, m)
}

// settle waits until no slot is write-pending: commits are acknowledged.
func settle(ctx context.Context, m kvtier.Manager) error {
	for {
		s, err := m.Stats(ctx)
		if err != nil {
			return err
		}
		if s.WritePending == 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

func runBare(o CPUOptions, res *CPUResult) error {
	st, err := cpu.NewState(o.Slots, o.Policy, time.Now)
	if err != nil {
		return err
	}
	var job uint64
	commit := func(keys []messages.Key) error {
		job++
		ref := messages.JobRef{Origin: messages.OriginEngine, ID: messages.JobID(job)}
		r, err := st.Reserve(ref, keys)
		if err != nil {
			return err
		}
		return st.Commit(ref, r.ToStore, true, make([]uint32, len(r.ToStore)))
	}
	for from := 0; from < o.Slots; from += 256 {
		if err := commit(keyRange(from, min(256, o.Slots-from))); err != nil {
			return err
		}
	}
	keys := keyRange(0, o.LookupKeys)
	lat := make([]time.Duration, 0, o.Lookups)
	var total time.Duration
	for i := range o.Lookups {
		h := messages.Holder{Origin: messages.OriginEngine, ID: fmt.Sprintf("l%d", i)}
		start := time.Now()
		st.LookupAndLease(h, keys, true, 30*time.Second)
		d := time.Since(start)
		lat, total = append(lat, d), total+d
		st.ReleaseHolder(h)
	}
	res.BareLookupP50us = percentileUs(lat, 0.50)
	res.BareKeyLookupsPerS = float64(o.Lookups*o.LookupKeys) / total.Seconds()

	next := o.Slots
	start := time.Now()
	for range o.StoreRounds {
		if err := commit(keyRange(next, o.StoreBatch)); err != nil {
			return err
		}
		next += o.StoreBatch
	}
	res.BareStoresPerS = float64(o.StoreRounds*o.StoreBatch) / time.Since(start).Seconds()
	return nil
}

func percentileUs(d []time.Duration, p float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	i := min(len(s)-1, int(p*float64(len(s))))
	return float64(s[i].Nanoseconds()) / 1e3
}
