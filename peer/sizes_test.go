package peer

import (
	"bytes"
	"context"
	"hash/crc32"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/internal/testutil/testleak"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/peer/peermsg"
	"github.com/kvtier/kvtier/rdma"
	"github.com/kvtier/kvtier/rdma/tcp"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
)

// Blocks of several sizes between two real nodes: real ZeroMQ control
// planes, the real TCP data plane, a stand-in CPU tier on the producer
// that holds its blocks at the start of their slots and counts the leases
// and pins a peer's rounds hold.

const sizesWait = 10 * time.Second // bound on any one answer; never a sleep

// fakeCPU is the producer's CPU tier: blocks by key, and what peers hold.
type fakeCPU struct {
	blocks map[messages.Key]fakeBlock
	leases map[messages.Holder]bool
	pins   map[messages.JobRef]int // keys still pinned, per job
}

type fakeBlock struct {
	slot int
	sum  uint32
}

// cpuHolds asks the fake CPU tier what peers' rounds still hold: answered
// after every message sent to it before (its mailbox is FIFO).
type cpuHolds struct{}

type holds struct{ leases, pins int }

func (c *fakeCPU) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *cpumsg.LookupAndLease:
		res := &cpumsg.LookupResult{Corr: m.Corr, Holder: m.Holder, Status: make([]messages.LookupStatus, len(m.Keys)),
			Checksums: make([]uint32, len(m.Keys))}
		if m.WantSlots {
			res.Slots = make([]int, len(m.Keys))
		}
		for i, k := range m.Keys {
			if b, ok := c.blocks[k]; ok {
				res.Status[i], res.Checksums[i] = messages.Hit, b.sum
				if m.WantSlots {
					res.Slots[i] = b.slot
				}
				c.leases[m.Holder] = true
			}
		}
		ctx.Respond(res)
	case *cpumsg.LeaseToPin:
		res := &cpumsg.PinResult{Corr: m.Corr, Job: m.Job, Slots: make([]int, len(m.Keys))}
		for i, k := range m.Keys {
			b, ok := c.blocks[k]
			if !ok || !c.leases[m.Holder] {
				ctx.Respond(&cpumsg.PinResult{Corr: m.Corr, Job: m.Job, Err: messages.ErrUnknownKey})
				return
			}
			res.Slots[i] = b.slot
		}
		c.pins[m.Job] += len(m.Keys)
		ctx.Respond(res)
	case *cpumsg.UnpinKeys:
		if c.pins[m.Job] -= len(m.Keys); c.pins[m.Job] <= 0 {
			delete(c.pins, m.Job)
		}
	case *cpumsg.ReleaseJob:
		delete(c.pins, m.Job)
	case *cpumsg.ReleaseHolder:
		delete(c.leases, m.Holder)
	case *cpuHolds:
		ctx.Respond(holds{leases: len(c.leases), pins: len(c.pins)})
	case *blockAt:
		c.blocks[m.k] = m.b
	}
}

// upTier is the P2P tier: it hands each session that comes up to a test.
type upTier struct{ ups chan<- *Up }

func (u *upTier) Receive(ctx actor.Context) {
	if m, ok := ctx.Message().(*Up); ok {
		u.ups <- m
	}
}

// sizesNode is one node of the test: its pool, data plane and plane.
type sizesNode struct {
	id     string
	addr   string // its control plane
	region rdma.Region
	plane  *actor.PID
	cpu    *actor.PID
}

// sizesNet runs nodes in one actor system and stops everything, then
// checks no goroutine is left.
type sizesNet struct {
	t   *testing.T
	sys *actor.ActorSystem
	ups chan *Up
}

func newSizesNet(t *testing.T) *sizesNet {
	ignore := []goleak.Option{goleak.IgnoreCurrent(), testleak.ZMQPubWriter}
	n := &sizesNet{t: t, sys: actors.NewSystem(zerolog.Nop()), ups: make(chan *Up, 4)}
	t.Cleanup(func() {
		n.sys.Shutdown()
		goleak.VerifyNone(t, ignore...)
	})
	return n
}

// node starts one: slots of slotBytes, blocks of a namespace as long as
// sizes says, dialing peers.
func (n *sizesNet) node(id string, slots, slotBytes int, sizes map[string]int, peers ...*sizesNode) *sizesNode {
	t := n.t
	tr, err := tcp.New(tcp.Config{Node: id, Listen: "127.0.0.1:0", Log: zerolog.Nop()})
	require.NoError(t, err)
	region := rdma.Region{Base: make([]byte, slots*slotBytes), SlotBytes: slotBytes, Slots: slots}
	require.NoError(t, tr.Register(region))
	t.Cleanup(func() { require.NoError(t, tr.Close()) }) // after the plane stopped (cleanups run last first)
	var addrs []Addr
	for _, p := range peers {
		addrs = append(addrs, Addr{Node: p.id, Addr: p.addr})
	}
	cpu, err := n.sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor {
		return &fakeCPU{blocks: map[messages.Key]fakeBlock{}, leases: map[messages.Holder]bool{}, pins: map[messages.JobRef]int{}}
	}), id+"-cpu")
	require.NoError(t, err)
	tier := n.sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &upTier{ups: n.ups} }))
	cfg := Config{Node: id, Listen: "tcp://127.0.0.1:0", Secret: []byte("sizes-test-secret-0123"), Peers: addrs,
		BlockBytes: slotBytes, Slots: slots, BlockSizes: sizes, Transport: tr, Region: region, CPU: cpu, Tier: tier,
		HeartbeatInterval: -1, Log: zerolog.Nop()}.WithDefaults()
	require.NoError(t, cfg.Validate())
	ctr := NewCounters()
	ln, err := Listen(cfg, ctr)
	require.NoError(t, err)
	plane, err := n.sys.Root.SpawnNamed(Props(cfg, ln, ctr), id+"-peers")
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), sizesWait)
		defer cancel()
		require.NoError(t, actors.StopAndWait(ctx, n.sys, plane))
		ln.Close()
	})
	return &sizesNode{id: id, addr: ln.Addr(), region: region, plane: plane, cpu: cpu}
}

// up waits for the next session to come up.
func (n *sizesNet) up() *Up {
	n.t.Helper()
	select {
	case u := <-n.ups:
		return u
	case <-time.After(sizesWait):
		n.t.Fatal("no peer session came up")
		return nil
	}
}

// ask sends m to pid and waits for its answer.
func ask[T any](n *sizesNet, pid *actor.PID, m any) T {
	n.t.Helper()
	res, err := n.sys.Root.RequestFuture(pid, m, sizesWait).Result()
	require.NoError(n.t, err)
	v, ok := res.(T)
	require.True(n.t, ok, "answer %T", res)
	return v
}

// store puts a block of n random bytes for k at the start of slot on s.
func (s *sizesNode) store(n *sizesNet, rng *rand.Rand, k messages.Key, slot, size int) {
	b := s.region.Block(slot, size)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	sum := crc32.Checksum(b, castagnoli)
	n.sys.Root.Send(s.cpu, &blockAt{k: k, b: fakeBlock{slot: slot, sum: sum}})
}

// blockAt gives the fake CPU tier a block (before any round asks for it:
// the mailbox is FIFO and the test asks after).
type blockAt struct {
	k messages.Key
	b fakeBlock
}

func sizesKey(ns string, i int) messages.Key {
	return messages.Key{Namespace: messages.Namespace(ns), Hash: string([]byte{byte(i >> 8), byte(i), 0xb1}), Group: 0}
}

// fetchAll looks keys up on the session and fetches every hit into the
// consumer's slots 0.., returning the lookup's and the fetch's answers.
func (n *sizesNet) fetchAll(session *actor.PID, keys []messages.Key) (*peermsg.LookupResult, *peermsg.FetchResult, []int) {
	n.t.Helper()
	lr := ask[*peermsg.LookupResult](n, session, &peermsg.Lookup{Corr: 1, Keys: keys})
	require.NoError(n.t, lr.Err)
	f := &peermsg.Fetch{Corr: 2, Round: lr.Round}
	for i, k := range keys {
		if !lr.Hits[i] {
			continue
		}
		f.Keys, f.Slots, f.Checksums = append(f.Keys, k), append(f.Slots, len(f.Slots)), append(f.Checksums, lr.Checksums[i])
		if lr.Sizes != nil {
			f.Sizes = append(f.Sizes, lr.Sizes[i])
		}
	}
	fr := ask[*peermsg.FetchResult](n, session, f)
	return lr, fr, f.Slots
}

// noHolds checks the producer's CPU tier holds nothing for peers any more.
func (n *sizesNet) noHolds(s *sizesNode) {
	n.t.Helper()
	require.Equal(n.t, holds{}, ask[holds](n, s.cpu, &cpuHolds{}), "leases and pins left at %s", s.id)
}

// Blocks of 4 KiB and 12 KiB interleaved, in slots of 12 KiB on both
// nodes, enough of them for more than one chunk: every block lands at the
// start of its slot byte for byte, the rest of the slot untouched, and the
// fetch counts each block at its own length.
func TestPeerFetchesBlocksOfSeveralSizes(t *testing.T) {
	const slotBytes, small, slots = 12288, 4096, 1100
	n := newSizesNet(t)
	sizes := map[string]int{"ns-small": small} // ns-big: whole slots
	prod := n.node("prod", slots, slotBytes, sizes)
	cons := n.node("cons", slots, slotBytes, sizes, prod)
	session := n.up().Session

	rng := rand.New(rand.NewPCG(42, 1))
	var keys []messages.Key
	var lens []int
	for i := range 1060 { // 530 × 16 KiB: more than ChunkBytes
		ns, size := "ns-big", slotBytes
		if i%2 == 0 {
			ns, size = "ns-small", small
		}
		k := sizesKey(ns, i)
		prod.store(n, rng, k, slots-1-i, size)
		keys, lens = append(keys, k), append(lens, size)
	}
	keys = append(keys, sizesKey("ns-big", 5000)) // a miss
	for i := range cons.region.Base {
		cons.region.Base[i] = 0xee // to see that no byte past a block moves
	}

	lr, fr, dst := n.fetchAll(session, keys)
	require.Equal(t, append(append([]int(nil), lens...), 0), lr.Sizes)
	require.Greater(t, planChunks(lens).count(), 1, "more than one chunk")
	require.NoError(t, fr.Err)
	require.Equal(t, rdma.Sum(lens), fr.Bytes)
	for i := range lens {
		require.True(t, fr.OK[i], "block %d verified", i)
		want := prod.region.Block(slots-1-i, lens[i])
		got := cons.region.Slot(dst[i])
		require.Equal(t, want, got[:lens[i]], "block %d (%d bytes)", i, lens[i])
		require.Equal(t, slotBytes-lens[i], bytes.Count(got[lens[i]:], []byte{0xee}), "slot %d past its block of %d bytes", dst[i], lens[i])
	}
	n.noHolds(prod)
}

// Nodes whose pools have slots of different sizes now open a session, and
// a block that fits both moves: here the producer's blocks are whole slots
// of 4 KiB, taken into the consumer's slots of 12 KiB.
func TestPeersOfDifferentSlotSizesExchangeBlocksThatFitBoth(t *testing.T) {
	n := newSizesNet(t)
	prod := n.node("small-prod", 16, 4096, nil)
	cons := n.node("big-cons", 16, 12288, nil, prod)
	session := n.up().Session

	rng := rand.New(rand.NewPCG(7, 1))
	keys := []messages.Key{sizesKey("ns", 1), sizesKey("ns", 2)}
	prod.store(n, rng, keys[0], 3, 4096)
	prod.store(n, rng, keys[1], 9, 4096)
	lr, fr, dst := n.fetchAll(session, keys)
	require.Equal(t, []int{4096, 4096}, lr.Sizes, "the producer's blocks, shorter than our slots")
	require.NoError(t, fr.Err)
	require.Equal(t, []bool{true, true}, fr.OK)
	require.Equal(t, int64(8192), fr.Bytes)
	require.Equal(t, prod.region.Slot(3), cons.region.Block(dst[0], 4096))
	require.Equal(t, prod.region.Slot(9), cons.region.Block(dst[1], 4096))
	n.noHolds(prod)
}
