package nixl

import (
	"fmt"
	"time"

	"github.com/kvtier/kvtier/rdma"
)

// book is the consumer side's decision logic, free of C and goroutines (the
// raft habit): Expect, Cancel, a notification, a Disconnect or the clock go
// in; completions to deliver come out. The actor applies them. It also
// keeps the agent-name ↔ peer mapping a notification is checked against.
//
// Invariant: every expectation is in exp exactly until its completion is
// returned, once. An expectation that was canceled or whose peer went away
// keeps its slots (stays in exp, state != waiting) until the producer's
// notification for its token arrives or its releaseAt passes: a remote
// WRITE cannot be recalled, so this is the only point after which no late
// write for that token can land (docs/NIXL.md, "Cancel").
type book struct {
	slotBytes int
	slots     int
	grace     time.Duration // LateWriteGrace; 0: release at once

	exp     map[rdma.Token]*expectation
	perPeer map[string]int    // peer -> expectations in exp
	agentOf map[string]string // agent name -> peer, current and retired
	current map[string]string // peer -> its current agent name

	refused uint64
	okCount uint64
	failed  uint64
	bytesIn uint64
}

type expState uint8

const (
	waiting   expState = iota // for the producer's notification
	releasing                 // canceled or peer gone: waits for the notification or releaseAt
)

type expectation struct {
	peer      string
	tok       rdma.Token
	dst       []int
	bytes     int64 // the blocks' bytes (whole slots move; these count)
	digest    uint32
	done      func(rdma.Completion)
	state     expState
	err       error     // the completion's error once releasing
	releaseAt time.Time // releasing: when the slots are given back without a notification
}

// completion is one done call for the actor to dispatch.
type completion struct {
	done func(rdma.Completion)
	c    rdma.Completion
}

func newBook(slotBytes, slots int, grace time.Duration) *book {
	return &book{
		slotBytes: slotBytes, slots: slots, grace: grace,
		exp:     make(map[rdma.Token]*expectation),
		perPeer: make(map[string]int),
		agentOf: make(map[string]string),
		current: make(map[string]string),
	}
}

// connect records peer's (new) agent name. The previous one, if any, stays
// known for the expectations still waiting on it.
func (b *book) connect(peer, agent string) {
	b.current[peer] = agent
	b.agentOf[agent] = peer
	b.prune(peer)
}

// expect registers an expectation of blocks of lens bytes (nil: whole
// slots). NB: the remote WRITE moves whole slots (they are registered at a
// fixed size), so the lengths are checked and counted but not compared
// with the producer's: the consumer's checksum of each block is what
// catches a producer that disagrees.
func (b *book) expect(peer string, tok rdma.Token, dst, lens []int, done func(rdma.Completion)) error {
	if done == nil {
		return fmt.Errorf("nixl: expect %v: nil done", tok)
	}
	if len(dst) == 0 {
		return fmt.Errorf("nixl: expect %v: no slots: %w", tok, rdma.ErrBadSlot)
	}
	for _, s := range dst {
		if s < 0 || s >= b.slots {
			return fmt.Errorf("nixl: expect %v: slot %d of %d: %w", tok, s, b.slots, rdma.ErrBadSlot)
		}
	}
	lens, err := rdma.Lengths(lens, len(dst), b.slotBytes, b.slotBytes)
	if err != nil {
		return fmt.Errorf("nixl: expect %v: %w", tok, err)
	}
	if _, dup := b.exp[tok]; dup {
		return fmt.Errorf("nixl: expect %v: %w", tok, rdma.ErrDuplicateToken)
	}
	b.exp[tok] = &expectation{
		peer: peer, tok: tok, dst: append([]int(nil), dst...), bytes: rdma.Sum(lens),
		digest: slotDigest(dst), done: done,
	}
	b.perPeer[peer]++
	return nil
}

// cancel starts releasing tok's expectation; see release.
func (b *book) cancel(tok rdma.Token, now time.Time) []completion {
	e, ok := b.exp[tok]
	if !ok || e.state != waiting {
		return nil // unknown, finished or already releasing
	}
	return b.release(e, fmt.Errorf("nixl: expect %v: %w", tok, rdma.ErrCanceled), now)
}

// disconnect starts releasing every expectation from peer, and forgets its
// current agent (a notification from it still completes what waits).
func (b *book) disconnect(peer string, now time.Time) []completion {
	delete(b.current, peer)
	var out []completion
	for _, e := range b.exp {
		if e.peer == peer && e.state == waiting {
			out = append(out, b.release(e, fmt.Errorf("nixl: expect %v from %s: %w", e.tok, peer, rdma.ErrPeerGone), now)...)
		}
	}
	b.prune(peer)
	return out
}

// release moves e to releasing with err; with no grace it completes now.
func (b *book) release(e *expectation, err error, now time.Time) []completion {
	e.state, e.err = releasing, err
	if b.grace <= 0 {
		return []completion{b.finish(e, err)}
	}
	e.releaseAt = now.Add(b.grace)
	return nil
}

// notified handles one notification from agent. A malformed one, one from
// an agent we do not know, for a token not expected, from another peer, or
// naming other slots is refused and counted; the expectation stays intact.
func (b *book) notified(agent string, msg []byte) []completion {
	n, ok := decodeNotif(msg)
	if !ok {
		b.refused++
		return nil
	}
	peer, known := b.agentOf[agent]
	e, expected := b.exp[n.Token]
	if !known || !expected || e.peer != peer || n.Count != len(e.dst) || n.Digest != e.digest {
		b.refused++
		return nil
	}
	if e.state == waiting {
		b.okCount++
		b.bytesIn += uint64(e.bytes)
		c := b.finish(e, nil)
		c.c.Bytes = e.bytes
		return []completion{c}
	}
	return []completion{b.finish(e, e.err)} // the late write landed: now it is safe
}

// expire completes the releasing expectations whose grace has passed.
func (b *book) expire(now time.Time) []completion {
	var out []completion
	for _, e := range b.exp {
		if e.state == releasing && !now.Before(e.releaseAt) {
			out = append(out, b.finish(e, e.err))
		}
	}
	return out
}

// closeAll completes everything with err (the agent is gone: nothing can
// write into the pool any more).
func (b *book) closeAll(err error) []completion {
	var out []completion
	for _, e := range b.exp {
		out = append(out, b.finish(e, err))
	}
	return out
}

// finish removes e and returns its completion.
func (b *book) finish(e *expectation, err error) completion {
	delete(b.exp, e.tok)
	if b.perPeer[e.peer]--; b.perPeer[e.peer] <= 0 {
		delete(b.perPeer, e.peer)
	}
	if err != nil {
		b.failed++
	}
	b.prune(e.peer)
	return completion{done: e.done, c: rdma.Completion{Token: e.tok, Peer: e.peer, Err: err}}
}

// prune forgets peer's retired agent names once nothing waits on them.
func (b *book) prune(peer string) {
	if b.perPeer[peer] > 0 {
		return
	}
	cur := b.current[peer]
	for a, p := range b.agentOf {
		if p == peer && a != cur {
			delete(b.agentOf, a)
		}
	}
}

// pending is the number of expectations holding slots.
func (b *book) pending() int { return len(b.exp) }
