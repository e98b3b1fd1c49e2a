package bench

// The fleet scenario (issue "Fleet"): N nodes in this process, finding each
// other through a real etcd server on loopback, serving a shared workload
// whose requests land on random nodes, so a conversation's earlier turns
// are usually on another node. It runs twice on the same workload — once
// with the peer directory (a miss asks only the peers whose KV events name
// one of its keys), once asking every ready peer — and reports, side by
// side, what a miss costs in peermsg.Lookup messages and what share of the
// blocks not on the node were found on a peer.
//
// One process, because 64 processes on a 2-core machine measure the
// scheduler; each node is still a whole kvtier node (actor system, pool,
// ZeroMQ control plane, tcp data plane, events publisher, etcd
// registration), and nodes talk only over loopback sockets.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/internal/testutil/testetcd"
	"github.com/kvtier/kvtier/messages"
)

// FleetOptions size the fleet scenario.
type FleetOptions struct {
	Nodes         int           // nodes in the fleet
	BlockBytes    int           // block size
	Slots         int           // CPU slots per node
	Conversations int           // conversations in the workload (default 4 per node; no flag: the workload's shape is fixed)
	Turns         int           // turns per conversation
	TurnBlocks    int           // blocks each turn adds to its conversation's prefix
	Requests      int           // requests in the workload (each a turn on a random node)
	ThinkTime     time.Duration // a conversation's next turn comes no sooner after its last
	Seed          uint64        // workload seed
	IdleWindow    time.Duration // how long the idle fleet's context switches are counted
	Etcd          string        // the etcd binary (default: etcd on PATH)
	Timeout       time.Duration
}

// DefaultFleetOptions is what `kvtier bench fleet` runs with no flags.
func DefaultFleetOptions() FleetOptions {
	return FleetOptions{Nodes: 16, BlockBytes: 4 << 10, Slots: 512, Turns: 6, TurnBlocks: 4,
		Requests: 1500, ThinkTime: 50 * time.Millisecond, Seed: 1, IdleWindow: 3 * time.Second, Timeout: 10 * time.Minute}
}

// FleetResult is the scenario's report: the directory run's figures, with
// the ask-all run's beside them where they differ.
type FleetResult struct {
	Nodes                 int     `json:"nodes"`
	ConvergeS             float64 `json:"converge_s"`                // first node opened → every node has a session to every other
	MessagesPerMiss       float64 `json:"messages_per_miss"`         // PeerLookups per lookup that reached the peer tier, with the directory
	AskAllMessagesPerMiss float64 `json:"ask_all_messages_per_miss"` // the same, asking every ready peer
	PeerHitRate           float64 `json:"peer_hit_rate"`             // blocks found on a peer / blocks not on the node, with the directory
	AskAllPeerHitRate     float64 `json:"ask_all_peer_hit_rate"`
	LookupP50us           float64 `json:"lookup_p50_us"` // a request's lookup until settled, with the directory
	LookupP99us           float64 `json:"lookup_p99_us"`
	AskAllLookupP50us     float64 `json:"ask_all_lookup_p50_us"`
	AskAllLookupP99us     float64 `json:"ask_all_lookup_p99_us"`
	DirectoryBytesPerNode float64 `json:"directory_bytes_per_node"` // the directory's approximate memory, mean over nodes, at the end
	IdleCtxswPerS         float64 `json:"idle_ctxsw_per_s"`         // whole fleet (this process), idle, directory run
	Requests              int     `json:"requests"`
	BlocksLookedUp        int     `json:"blocks_looked_up"`
}

// fleetRun is one fleet's measurements.
type fleetRun struct {
	convergeS       float64
	messagesPerMiss float64
	peerHitRate     float64
	lookupUs        []float64
	dirBytes        float64
	idleCtxsw       float64
	blocks          int
}

// RunFleet starts etcd, then runs the workload on a fleet with the
// directory and on one without.
func RunFleet(ctx context.Context, o FleetOptions) (res FleetResult, err error) {
	if o.Nodes < 2 {
		return res, errors.New("bench fleet: want at least 2 nodes")
	}
	if o.Conversations == 0 {
		o.Conversations = 4 * o.Nodes
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	etcd, err := testetcd.Launch(ctx, o.Etcd)
	if err != nil {
		return res, fmt.Errorf("bench fleet: %w", err)
	}
	defer etcd.Stop()
	dir, err := runFleet(ctx, o, etcd.Endpoint(), "/bench-dir/", true)
	if err != nil {
		return res, fmt.Errorf("bench fleet (directory): %w", err)
	}
	all, err := runFleet(ctx, o, etcd.Endpoint(), "/bench-all/", false)
	if err != nil {
		return res, fmt.Errorf("bench fleet (ask-all): %w", err)
	}
	res = FleetResult{Nodes: o.Nodes, ConvergeS: dir.convergeS,
		MessagesPerMiss: dir.messagesPerMiss, AskAllMessagesPerMiss: all.messagesPerMiss,
		PeerHitRate: dir.peerHitRate, AskAllPeerHitRate: all.peerHitRate,
		DirectoryBytesPerNode: dir.dirBytes, IdleCtxswPerS: dir.idleCtxsw,
		Requests: o.Requests, BlocksLookedUp: dir.blocks}
	res.LookupP50us, res.LookupP99us = quantile(dir.lookupUs, 0.5), quantile(dir.lookupUs, 0.99)
	res.AskAllLookupP50us, res.AskAllLookupP99us = quantile(all.lookupUs, 0.5), quantile(all.lookupUs, 0.99)
	return res, nil
}

// runFleet opens the fleet, waits for it to converge, runs the workload,
// counts the idle fleet's wakeups and closes it.
func runFleet(ctx context.Context, o FleetOptions, etcd, prefix string, directory bool) (r fleetRun, err error) {
	start := time.Now()
	nodes := make([]*kvtier.Node, o.Nodes)
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		closeFleet(cctx, nodes)
	}()
	ids := make([]string, o.Nodes)
	for i := range nodes {
		ids[i] = fmt.Sprintf("n%02d", i)
		if nodes[i], err = kvtier.Open(ctx, fleetNodeConfig(o, ids[i], etcd, prefix, directory)); err != nil {
			return r, err
		}
	}
	for i, n := range nodes {
		others := append(append([]string(nil), ids[:i]...), ids[i+1:]...)
		if err := n.WaitPeers(ctx, others...); err != nil {
			return r, fmt.Errorf("%s never saw every other node: %w", ids[i], err)
		}
	}
	r.convergeS = time.Since(start).Seconds()
	w := newFleetWorkload(o)
	if err := w.run(ctx, nodes); err != nil {
		return r, err
	}
	r.lookupUs, r.blocks = w.lookupUs, w.blocks
	r.peerHitRate = ratio(float64(w.peerHits), float64(w.notLocal))
	var calls, asks uint64
	for _, n := range nodes {
		st, err := n.TieringStats(ctx)
		if err != nil {
			return r, err
		}
		for _, t := range st.Tiers {
			calls += t.LookupCalls
			asks += t.PeerAsks
			r.dirBytes += float64(t.DirectoryBytes) / float64(len(nodes))
		}
	}
	r.messagesPerMiss = ratio(float64(asks), float64(calls))
	r.idleCtxsw, err = idleWakeups(ctx, o.IdleWindow)
	return r, err
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func fleetNodeConfig(o FleetOptions, id, etcd, prefix string, directory bool) kvtier.Config {
	return kvtier.Config{PoolBytes: int64(o.Slots) * int64(o.BlockBytes), BlockBytes: o.BlockBytes,
		Events: kvtier.EventsConfig{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", NodeID: id},
		Peers: kvtier.PeersConfig{NodeID: id, Listen: "tcp://127.0.0.1:0", Secret: "bench-fleet-secret-0123456789",
			Directory: directory,
			Discovery: kvtier.DiscoveryConfig{Kind: "etcd", Endpoints: []string{etcd}, Prefix: prefix, TTL: 10 * time.Second}}}
}

// closeFleet closes every open node at once (a node's graceful close waits
// on its peers' Byes; one at a time would take N rounds of that).
func closeFleet(ctx context.Context, nodes []*kvtier.Node) {
	var wg sync.WaitGroup
	for _, n := range nodes {
		if n == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = n.Close(ctx)
		}()
	}
	wg.Wait()
}

// idleWakeups is this process's context switches per second over window,
// with nothing asked of the fleet.
func idleWakeups(ctx context.Context, window time.Duration) (float64, error) {
	before, _, err := ctxSwitches(os.Getpid())
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(window): // NB: the idle window being measured
	}
	after, _, err := ctxSwitches(os.Getpid())
	return float64(after-before) / time.Since(t0).Seconds(), err
}

// fleetWorkload is conversations whose turns land on random nodes: each
// request is the next turn of a conversation, its prompt the conversation's
// prefix so far plus the new turn's blocks. The engine of the node it lands
// on looks the prompt up (a prefix lookup, until nothing is pending), loads
// and verifies what it found, and stores the rest, as if it had computed
// it.
type fleetWorkload struct {
	o        FleetOptions
	rng      *rand.Rand
	turn     []int       // per conversation: turns served so far
	last     []time.Time // per conversation: when its last turn was served
	lookupUs []float64
	blocks   int // blocks looked up
	notLocal int // of those, blocks not in the node's CPU tier at the first lookup
	peerHits int // of those, blocks found on a peer
	seq      int
}

func newFleetWorkload(o FleetOptions) *fleetWorkload {
	return &fleetWorkload{o: o, rng: rand.New(rand.NewPCG(o.Seed, 0xf1ee7)), turn: make([]int, o.Conversations),
		last: make([]time.Time, o.Conversations)}
}

func (w *fleetWorkload) run(ctx context.Context, nodes []*kvtier.Node) error {
	for i := 0; i < w.o.Requests; i++ {
		c := w.rng.IntN(w.o.Conversations)
		if err := w.think(ctx, c); err != nil {
			return err
		}
		if w.turn[c] == w.o.Turns {
			w.turn[c] = 0 // the conversation starts over (a new session of the same system prompt)
		}
		w.turn[c]++
		n := nodes[w.rng.IntN(len(nodes))]
		if err := w.request(ctx, n, w.prompt(c, w.turn[c])); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		w.last[c] = time.Now()
	}
	return nil
}

// think waits until conversation c's think time has passed since its last
// turn: between two turns the model answers and the user replies, and a
// node's KV events, batched for 10 ms, have long reached its peers.
func (w *fleetWorkload) think(ctx context.Context, c int) error {
	wait := time.Until(w.last[c].Add(w.o.ThinkTime))
	if wait <= 0 {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(wait): // NB: the workload's think time, not synchronisation
		return nil
	}
}

// prompt is conversation c's blocks up to turn t: block j of conversation
// c is fleetKey(c<<32|j), the same on every node.
func (w *fleetWorkload) prompt(c, t int) []messages.Key {
	ks := make([]messages.Key, t*w.o.TurnBlocks)
	for j := range ks {
		ks[j] = fleetKey(c<<32 | j)
	}
	return ks
}

// fleetKey is benchKey with the id in the hash's last 8 bytes too: KV
// events carry a hash's low 64 bits, and a directory that saw every block
// under one hash would name every peer.
func fleetKey(i int) messages.Key {
	k := benchKey(i)
	h := []byte(k.Hash)
	binary.BigEndian.PutUint64(h[len(h)-8:], uint64(i))
	k.Hash = string(h)
	return k
}

func (w *fleetWorkload) request(ctx context.Context, n *kvtier.Node, ks []messages.Key) error {
	w.seq++
	m := n.Manager()
	req := &messages.ReqContext{RequestID: fmt.Sprintf("fleet-%d", w.seq)}
	defer m.RequestFinished(ctx, req) //nolint:errcheck // best effort: the next request does not depend on it
	t0 := time.Now()
	first, st, err := settledLookup(ctx, m, req, ks)
	if err != nil {
		return err
	}
	w.lookupUs = append(w.lookupUs, float64(time.Since(t0).Microseconds()))
	hits := 0
	for hits < len(st) && st[hits] == messages.Hit {
		hits++
	}
	local := 0
	for local < len(first) && first[local] == messages.Hit {
		local++
	}
	w.blocks += len(ks)
	w.notLocal += len(ks) - local
	w.peerHits += max(hits-local, 0)
	if hits > 0 {
		if _, err := loadAndVerify(ctx, m, req, ks[:hits], w.o.BlockBytes); err != nil {
			return err
		}
	}
	return storeBlocks(ctx, m, req, ks[hits:])
}

// settledLookup looks ks up as a prefix until no block is pending (a
// promotion from a peer in flight), returning the first answer and the
// settled one.
func settledLookup(ctx context.Context, m kvtier.Manager, req *messages.ReqContext, ks []messages.Key) (first, st []messages.LookupStatus, err error) {
	for {
		if st, err = m.Lookup(ctx, req, ks, true); err != nil {
			return nil, nil, err
		}
		if first == nil {
			first = st
		}
		if !anyPending(st) {
			return first, st, nil
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(200 * time.Microsecond): // NB: the engine's step period, not synchronisation
		}
	}
}

func anyPending(st []messages.LookupStatus) bool {
	for _, s := range st {
		if s == messages.Retry || s == messages.HitPending {
			return true
		}
	}
	return false
}

// loadAndVerify loads ks and checks every byte against the pattern its
// storer wrote.
func loadAndVerify(ctx context.Context, m kvtier.Manager, req *messages.ReqContext, ks []messages.Key, blockBytes int) (int, error) {
	job, err := m.PrepareLoad(ctx, req, ks)
	if err != nil {
		return 0, err
	}
	want := make([]byte, blockBytes)
	for i, k := range ks {
		fillP2P(want, int(binary.BigEndian.Uint64([]byte(k.Hash))))
		if string(want) != string(m.Pool().Slot(job.Slots[i])) {
			return i, fmt.Errorf("block %d of %d: wrong bytes", i, len(ks))
		}
	}
	return len(ks), m.CompleteLoad(ctx, req, ks)
}

// storeBlocks stores ks (those the CPU tier does not hold already) with the
// pattern loadAndVerify checks.
func storeBlocks(ctx context.Context, m kvtier.Manager, req *messages.ReqContext, ks []messages.Key) error {
	if len(ks) == 0 {
		return nil
	}
	plan, err := m.PrepareStore(ctx, req, ks)
	if err != nil {
		if errors.Is(err, messages.ErrFull) {
			return nil // every slot is busy: the engine recomputes next time
		}
		return err
	}
	for i, k := range plan.ToStore {
		fillP2P(m.Pool().Slot(plan.Slots[i]), int(binary.BigEndian.Uint64([]byte(k.Hash))))
	}
	for wk := 0; wk < plan.Workers; wk++ {
		if err := m.JobDone(ctx, plan.Job, wk, true); err != nil {
			return err
		}
	}
	return nil
}
