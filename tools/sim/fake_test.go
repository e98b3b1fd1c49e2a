package sim

import (
	"container/list"
	"context"
	"fmt"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/messages"
)

// fakeNode is a minimal single-threaded kvtier.Manager for testing the
// engine without a node: an LRU CPU tier with leases, pins and write
// reservations, committed when a job's last worker reports.
type fakeNode struct {
	mem     *fakeMem
	lru     *list.List // of *fakeBlock, front = most recent
	index   map[messages.Key]*list.Element
	free    []int
	jobs    map[messages.JobID]*fakeJob
	nextJob messages.JobID
	workers int
	held    map[string][]messages.Key // keys each request may hold leases on
	corrupt bool                      // flip a byte of every slot handed to a load
}

type fakeBlock struct {
	key    messages.Key
	slot   int
	ready  bool
	pins   int
	leases map[string]bool
}

type fakeJob struct {
	load bool
	keys []messages.Key
	left int
}

type fakeMem struct {
	bytes []byte
	bs    int
}

func (m *fakeMem) Slot(i int) []byte { return m.bytes[i*m.bs : (i+1)*m.bs] }
func (m *fakeMem) BlockBytes() int   { return m.bs }
func (m *fakeMem) Slots() int        { return len(m.bytes) / m.bs }

func newFakeNode(slots, blockBytes, workers int) *fakeNode {
	n := &fakeNode{mem: &fakeMem{bytes: make([]byte, slots*blockBytes), bs: blockBytes},
		lru: list.New(), index: map[messages.Key]*list.Element{}, jobs: map[messages.JobID]*fakeJob{}, held: map[string][]messages.Key{}, workers: workers}
	for i := slots - 1; i >= 0; i-- {
		n.free = append(n.free, i)
	}
	return n
}

var _ kvtier.Manager = (*fakeNode)(nil)

func (n *fakeNode) block(k messages.Key) *fakeBlock {
	if e, ok := n.index[k]; ok {
		return e.Value.(*fakeBlock)
	}
	return nil
}

func (n *fakeNode) Lookup(_ context.Context, req *messages.ReqContext, keys []messages.Key, prefix bool) ([]messages.LookupStatus, error) {
	st := make([]messages.LookupStatus, len(keys))
	for i, k := range keys {
		b := n.block(k)
		switch {
		case b == nil:
			return st, nil
		case !b.ready:
			st[i] = messages.HitPending
			return st, nil
		}
		st[i] = messages.Hit
		b.leases[req.RequestID] = true
		n.held[req.RequestID] = append(n.held[req.RequestID], k)
		n.lru.MoveToFront(n.index[k])
	}
	return st, nil
}

func (n *fakeNode) PrepareLoad(_ context.Context, req *messages.ReqContext, keys []messages.Key) (messages.LoadJob, error) {
	lj := messages.LoadJob{Workers: n.workers}
	for _, k := range keys {
		b := n.block(k)
		if b == nil || !b.leases[req.RequestID] {
			return messages.LoadJob{}, messages.ErrUnknownKey
		}
	}
	for _, k := range keys {
		b := n.block(k)
		delete(b.leases, req.RequestID)
		b.pins++
		lj.Slots = append(lj.Slots, b.slot)
		if n.corrupt && Verify(n.mem.Slot(b.slot), k) {
			n.mem.Slot(b.slot)[7] ^= 1
		}
	}
	n.nextJob++
	lj.ID = n.nextJob
	n.jobs[lj.ID] = &fakeJob{load: true, keys: keys, left: n.workers}
	return lj, nil
}

func (n *fakeNode) Touch(_ context.Context, _ *messages.ReqContext, keys []messages.Key) error {
	for _, k := range keys {
		if e, ok := n.index[k]; ok {
			n.lru.MoveToFront(e)
		}
	}
	return nil
}

func (n *fakeNode) CompleteLoad(context.Context, *messages.ReqContext, []messages.Key) error {
	return fmt.Errorf("not used")
}

func (n *fakeNode) evictable(b *fakeBlock) bool { return b.ready && b.pins == 0 && len(b.leases) == 0 }

func (n *fakeNode) PrepareStore(_ context.Context, _ *messages.ReqContext, keys []messages.Key) (messages.StorePlan, error) {
	var todo []messages.Key
	for _, k := range keys {
		if n.block(k) == nil {
			todo = append(todo, k)
		}
	}
	var victims []*list.Element
	for e := n.lru.Back(); e != nil && len(n.free)+len(victims) < len(todo); e = e.Prev() {
		if n.evictable(e.Value.(*fakeBlock)) {
			victims = append(victims, e)
		}
	}
	if len(n.free)+len(victims) < len(todo) {
		return messages.StorePlan{}, messages.ErrFull
	}
	plan := messages.StorePlan{Workers: n.workers}
	for _, e := range victims {
		b := n.lru.Remove(e).(*fakeBlock)
		delete(n.index, b.key)
		n.free = append(n.free, b.slot)
		plan.Evicted = append(plan.Evicted, b.key)
	}
	for _, k := range todo {
		s := n.free[len(n.free)-1]
		n.free = n.free[:len(n.free)-1]
		n.index[k] = n.lru.PushFront(&fakeBlock{key: k, slot: s, leases: map[string]bool{}})
		plan.ToStore = append(plan.ToStore, k)
		plan.Slots = append(plan.Slots, s)
	}
	if len(todo) > 0 {
		n.nextJob++
		plan.Job = n.nextJob
		n.jobs[plan.Job] = &fakeJob{keys: todo, left: n.workers}
	}
	return plan, nil
}

func (n *fakeNode) CompleteStore(context.Context, *messages.ReqContext, []messages.Key, bool) error {
	return fmt.Errorf("not used")
}

func (n *fakeNode) JobDone(_ context.Context, id messages.JobID, worker int, ok bool) error {
	j := n.jobs[id]
	if j == nil {
		return messages.ErrUnknownJob
	}
	if j.left--; j.left > 0 {
		return nil
	}
	delete(n.jobs, id)
	for _, k := range j.keys {
		if b := n.block(k); b != nil {
			if j.load {
				b.pins--
			} else {
				b.ready = true
			}
		}
	}
	return nil
}

func (n *fakeNode) RequestFinished(_ context.Context, req *messages.ReqContext) error {
	for _, k := range n.held[req.RequestID] {
		if b := n.block(k); b != nil {
			delete(b.leases, req.RequestID)
		}
	}
	delete(n.held, req.RequestID)
	return nil
}

func (n *fakeNode) TakeEvents(context.Context) ([]messages.Event, error) { return nil, nil }
func (n *fakeNode) HasPendingWork(context.Context) (bool, error)         { return len(n.jobs) > 0, nil }
func (n *fakeNode) Pause(context.Context, bool) error                    { return nil }
func (n *fakeNode) Resume(context.Context) error                         { return nil }
func (n *fakeNode) ResetCache(context.Context) error                     { return nil }
func (n *fakeNode) Pool() kvtier.SlotMemory                              { return n.mem }

func (n *fakeNode) Stats(context.Context) (messages.Stats, error) {
	var st messages.Stats
	for e := n.lru.Front(); e != nil; e = e.Next() {
		b := e.Value.(*fakeBlock)
		if b.pins > 0 {
			st.Pinned++
		}
		if len(b.leases) > 0 {
			st.Leased++
		}
		if !b.ready {
			st.WritePending++
		}
	}
	return st, nil
}
