package cpu

import (
	clist "container/list"

	"github.com/kvtier/kvtier/messages"
)

// arc is Adaptive Replacement Cache (Megiddo & Modha) over slots: T1 holds
// blocks used once since they entered, T2 blocks used again; the ghost lists
// B1 and B2 remember keys recently evicted from each, and a hit on a ghost
// moves the target size p of T1 toward the list that would have kept it.
type arc struct {
	t1, t2 list
	key    []messages.Key
	p      int // target size of T1
	c      int // capacity in slots
	b1, b2 ghosts
}

func newARC(n int) *arc {
	return &arc{t1: newList(n), t2: newList(n), key: make([]messages.Key, n), c: n,
		b1: newGhosts(), b2: newGhosts()}
}

func (a *arc) Insert(slot int, key messages.Key) {
	a.key[slot] = key
	switch {
	case a.b1.remove(key):
		a.p = min(a.c, a.p+max(1, a.b2.len()/max(1, a.b1.len()+1)))
		a.t2.pushFront(slot)
	case a.b2.remove(key):
		a.p = max(0, a.p-max(1, a.b1.len()/max(1, a.b2.len()+1)))
		a.t2.pushFront(slot)
	default:
		a.t1.pushFront(slot)
	}
}

func (a *arc) Access(slot int) {
	switch {
	case a.t1.in[slot]:
		a.t1.remove(slot)
		a.t2.pushFront(slot)
	case a.t2.in[slot]:
		a.t2.remove(slot)
		a.t2.pushFront(slot)
	}
}

func (a *arc) Remove(slot int) {
	switch {
	case a.t1.in[slot]:
		a.t1.remove(slot)
	case a.t2.in[slot]:
		a.t2.remove(slot)
	}
}

func (a *arc) Len() int { return a.t1.size + a.t2.size }

func (a *arc) Victim(evictable func(int) bool) (int, bool) {
	first, second, firstGhost, secondGhost := &a.t2, &a.t1, &a.b2, &a.b1
	if a.t1.size > 0 && (a.t1.size > a.p || a.t2.size == 0) {
		first, second, firstGhost, secondGhost = &a.t1, &a.t2, &a.b1, &a.b2
	}
	if s, ok := first.lastEvictable(evictable); ok {
		first.remove(s)
		firstGhost.add(a.key[s], a.c)
		return s, true
	}
	if s, ok := second.lastEvictable(evictable); ok {
		second.remove(s)
		secondGhost.add(a.key[s], a.c)
		return s, true
	}
	return 0, false
}

// ghosts is a bounded LRU set of keys.
type ghosts struct {
	order *clist.List
	at    map[messages.Key]*clist.Element
}

func newGhosts() ghosts { return ghosts{order: clist.New(), at: map[messages.Key]*clist.Element{}} }

func (g *ghosts) len() int { return g.order.Len() }

func (g *ghosts) add(k messages.Key, limit int) {
	if e, ok := g.at[k]; ok {
		g.order.MoveToFront(e)
		return
	}
	g.at[k] = g.order.PushFront(k)
	for g.order.Len() > limit {
		old := g.order.Back()
		g.order.Remove(old)
		delete(g.at, old.Value.(messages.Key))
	}
}

func (g *ghosts) remove(k messages.Key) bool {
	e, ok := g.at[k]
	if ok {
		g.order.Remove(e)
		delete(g.at, k)
	}
	return ok
}
