package scheduler

import (
	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
)

// callOrder makes engine calls take effect in the order the bridge received
// them, although a commit's checksum runs off the mailbox: between a
// CompleteStore (or a store job's last JobDone) and the CommitSlots it
// sends the CPU tier, a later call could otherwise overtake it — a load
// sent right behind its own quiet complete_store found UNKNOWN_KEY.
//
// A call waits (is held, in arrival order) while
//   - it names a key whose commit is being checksummed, or
//   - an earlier call of its request is held (a request's calls never
//     overtake each other: a RequestFinished behind a held load waits too,
//     or the load would recreate the request's state after its end), or
//   - an earlier barrier is held;
//
// a barrier (TakeEvents, HasPendingWork, Pause, Resume, ResetCache,
// ReleaseSession: calls about everything before them) waits while any call
// is held. JobDone and Grant never wait: they name a job or a session's
// credit, which no held call can create.
//
// Calls of other requests on other keys, and every peer's call (they do
// not pass through the bridge), are never held. It is a plain struct: the
// bridge calls issued when a checksum starts, landed when its commit is
// sent, and re-admits what release returns.
type callOrder struct {
	pending  map[messages.Key]int // keys of commits being checksummed
	held     []any                // calls waiting, oldest first
	reqs     map[string]int       // held calls per request id
	barriers int                  // held barriers
}

// callKind is how a call is ordered.
type callKind uint8

const (
	kindFree    callKind = iota // never waits
	kindRequest                 // waits for its request's held calls and for pending keys
	kindBarrier                 // waits for every held call
)

// classify says how m is ordered, its request id and its keys.
func classify(m any) (callKind, string, []messages.Key) {
	switch m := m.(type) {
	case *messages.Lookup:
		return kindRequest, reqID(m.Req), m.Keys
	case *messages.PrepareLoad:
		return kindRequest, reqID(m.Req), m.Keys
	case *messages.Touch:
		return kindRequest, reqID(m.Req), m.Keys
	case *messages.CompleteLoad:
		return kindRequest, reqID(m.Req), m.Keys
	case *messages.PrepareStore:
		return kindRequest, reqID(m.Req), m.Keys
	case *messages.CompleteStore:
		return kindRequest, reqID(m.Req), m.Keys
	case *messages.StoreCredited:
		return kindRequest, reqID(m.Req), m.Keys
	case *messages.RequestFinished:
		return kindRequest, reqID(m.Req), nil
	case *messages.TakeEvents, *messages.HasPendingWork, *messages.Pause, *messages.Resume,
		*messages.ResetCache, *messages.ReleaseSession:
		return kindBarrier, "", nil
	}
	return kindFree, "", nil
}

func reqID(r *messages.ReqContext) string {
	if r == nil {
		return ""
	}
	return r.RequestID
}

// issued records a commit of keys whose checksum began.
func (o *callOrder) issued(keys []messages.Key) {
	if len(keys) == 0 {
		return
	}
	if o.pending == nil {
		o.pending = make(map[messages.Key]int, len(keys))
	}
	for _, k := range keys {
		o.pending[k]++
	}
}

// landed records that the commit of keys was sent to the CPU tier (which
// serves its mailbox in order: any call sent after it sees it).
func (o *callOrder) landed(keys []messages.Key) {
	for _, k := range keys {
		if n := o.pending[k]; n > 1 {
			o.pending[k] = n - 1
		} else {
			delete(o.pending, k)
		}
	}
}

// admit says whether m may be served now; if not, it is held.
func (o *callOrder) admit(m any) bool {
	if len(o.held) == 0 && len(o.pending) == 0 {
		return true // the common case: nothing in flight
	}
	kind, req, keys := classify(m)
	switch kind {
	case kindFree:
		return true
	case kindBarrier:
		if len(o.held) == 0 {
			return true
		}
		o.barriers++
	case kindRequest:
		if o.barriers == 0 && o.reqs[req] == 0 && !o.names(keys) {
			return true
		}
		if o.reqs == nil {
			o.reqs = map[string]int{}
		}
		o.reqs[req]++
	}
	o.held = append(o.held, m)
	return false
}

// names says whether a pending commit has one of keys.
func (o *callOrder) names(keys []messages.Key) bool {
	if len(o.pending) == 0 {
		return false
	}
	for _, k := range keys {
		if o.pending[k] > 0 {
			return true
		}
	}
	return false
}

// release returns the held calls, oldest first, and forgets them: the
// bridge re-admits each in that order (some may be held again).
func (o *callOrder) release() []any {
	held := o.held
	o.held, o.barriers = nil, 0
	clear(o.reqs)
	return held
}

// waiting is the number of held calls.
func (o *callOrder) waiting() int { return len(o.held) }

// failCall answers a held call with err, through out.
func failCall(out *fx.Out, m any, err error) {
	switch m := m.(type) {
	case *messages.Lookup:
		reply(out, m.Reply, nil, err)
	case *messages.PrepareLoad:
		reply(out, m.Reply, messages.LoadJob{}, err)
	case *messages.Touch:
		reply(out, m.Reply, struct{}{}, err)
	case *messages.CompleteLoad:
		reply(out, m.Reply, struct{}{}, err)
	case *messages.PrepareStore:
		reply(out, m.Reply, messages.StorePlan{}, err)
	case *messages.CompleteStore:
		reply(out, m.Reply, struct{}{}, err)
	case *messages.StoreCredited:
		reply(out, m.Reply, messages.StoreBound{}, err)
	case *messages.RequestFinished:
		reply(out, m.Reply, struct{}{}, err)
	case *messages.TakeEvents:
		reply(out, m.Reply, nil, err)
	case *messages.HasPendingWork:
		reply(out, m.Reply, false, err)
	case *messages.Pause:
		reply(out, m.Reply, struct{}{}, err)
	case *messages.Resume:
		reply(out, m.Reply, struct{}{}, err)
	case *messages.ResetCache:
		reply(out, m.Reply, struct{}{}, err)
	case *messages.ReleaseSession:
		reply(out, m.Reply, messages.SessionReleased{}, err)
	}
}
