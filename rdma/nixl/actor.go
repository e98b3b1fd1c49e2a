//go:build nixl && cgo

package nixl

/*
#include <stdlib.h>
#include "kvn.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"time"
	"unsafe"

	"github.com/kvtier/kvtier/rdma"
)

// The actor: the only goroutine that calls NIXL for its agent. Its state
// is touched by no other goroutine; the mailbox gives it exclusivity.

type actor struct {
	t   *Transport
	lib *library
	api *C.kvn_api

	agent, backend, notifs C.kvn_h
	name                   *C.char // our agent name, C memory

	region rdma.Region // keeps a Go-allocated pool alive while registered
	base   uintptr
	local  C.kvn_h // prepared local slot list; nil before Register
	book   *book

	peers  map[string]*remote
	writes map[C.kvn_h]*pendingWrite
	out    []completion // to dispatch once the counters are published (flush)

	closed bool
}

// remote is one connected peer.
type remote struct {
	peer   string
	agent  *C.char // its agent name, C memory
	meta   peerMeta
	handle C.kvn_h // prepared remote slot list
}

type pendingWrite struct {
	peer     string
	tok      rdma.Token
	bytes    int64
	done     func(rdma.Completion)
	deadline time.Time
}

func (a *actor) run(ready chan<- error) {
	// NB: never unlocked: when this goroutine returns its thread exits with
	// it, taking UCX's thread-bound worker state along.
	runtime.LockOSThread()
	defer close(a.t.exited)
	if err := a.open(); err != nil {
		ready <- err
		return
	}
	ready <- nil
	a.loop()
}

// open creates the agent, the backend and the notification map.
func (a *actor) open() error {
	name := C.CString(a.t.info.Agent)
	if st := C.kvn_create_agent(a.api, name, &a.agent); st != 0 {
		C.free(unsafe.Pointer(name))
		return callErr("create_configured_agent", st, rdma.ErrUnavailable)
	}
	a.name = name
	if err := a.createBackend(); err != nil {
		a.destroy()
		return err
	}
	if st := C.kvn_create_notif_map(a.api, &a.notifs); st != 0 {
		a.destroy()
		return callErr("create_notif_map", st, rdma.ErrUnavailable)
	}
	return nil
}

func (a *actor) createBackend() error {
	var params C.kvn_h
	if st := C.kvn_create_params(a.api, &params); st != 0 {
		return callErr("create_params", st, rdma.ErrUnavailable)
	}
	defer C.kvn_destroy_params(a.api, params)
	for k, v := range a.t.cfg.BackendParams {
		ck, cv := C.CString(k), C.CString(v)
		st := C.kvn_params_add(a.api, params, ck, cv)
		C.free(unsafe.Pointer(ck))
		C.free(unsafe.Pointer(cv))
		if st != 0 {
			return callErr("params_add "+k, st, rdma.ErrUnavailable)
		}
	}
	plugin := C.CString(a.t.cfg.Backend)
	defer C.free(unsafe.Pointer(plugin))
	if st := C.kvn_create_backend(a.api, a.agent, plugin, params, &a.backend); st != 0 {
		return fmt.Errorf("%w (backend plugin %q: is %s set to the plugin directory, and does UCX find a transport? try UCX_TLS=tcp)",
			callErr("create_backend", st, rdma.ErrUnavailable), a.t.cfg.Backend, EnvPluginDir)
	}
	return nil
}

// destroy releases every NIXL object this agent holds, in reverse order.
func (a *actor) destroy() {
	for _, r := range a.peers {
		a.forget(r)
	}
	if a.local != nil {
		C.kvn_release_dlist(a.api, a.agent, a.local)
		a.local = nil
	}
	if a.base != 0 {
		C.kvn_register(a.api, a.agent, a.backend, C.uintptr_t(a.base), C.size_t(a.region.Slots*a.region.SlotBytes), true)
		a.base = 0
	}
	if a.notifs != nil {
		C.kvn_destroy_notif_map(a.api, a.notifs)
		a.notifs = nil
	}
	if a.backend != nil {
		C.kvn_destroy_backend(a.api, a.backend) // the handle only; the agent owns the engine
		a.backend = nil
	}
	if a.agent != nil {
		C.kvn_destroy_agent(a.api, a.agent)
		a.agent = nil
	}
	if a.name != nil {
		C.free(unsafe.Pointer(a.name))
		a.name = nil
	}
}

// busy: something is in flight, so the actor drives progress.
func (a *actor) busy() bool {
	return len(a.writes) > 0 || (a.book != nil && a.book.pending() > 0)
}

// loop serves the mailbox. Idle, it blocks on the mailbox and makes no
// wakeups. Busy, it calls NIXL's progress (through the status and
// notification calls) SpinRounds times back to back, then sleeps PollMin,
// doubling up to PollMax, between rounds; any completion or message
// starts the schedule over.
func (a *actor) loop() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	rounds, delay := 0, time.Duration(0)
	reset := func() { rounds, delay = 0, 0 }
	for !a.closed {
		if !a.busy() {
			a.handle(<-a.t.mbox)
			reset()
			continue
		}
		if a.progress(time.Now()) {
			reset()
		}
		a.flush()
		if !a.busy() {
			continue
		}
		select {
		case o := <-a.t.mbox:
			a.handle(o)
			reset()
			continue
		default:
		}
		if rounds++; rounds <= a.t.cfg.SpinRounds {
			continue
		}
		delay = min(max(2*delay, a.t.cfg.PollMin), a.t.cfg.PollMax)
		timer.Reset(delay)
		select {
		case o := <-a.t.mbox:
			timer.Stop()
			a.handle(o)
			reset()
		case <-timer.C:
		}
	}
}

func (a *actor) handle(o op) {
	switch o := o.(type) {
	case *opRegister:
		o.reply <- a.register(o.region)
	case *opConnect:
		o.reply <- a.connect(o.peer, o.meta)
	case *opDisconnect:
		a.disconnect(o.peer, fmt.Errorf("nixl: peer %s disconnected: %w", o.peer, rdma.ErrPeerGone))
	case *opExpect:
		o.reply <- a.expect(o)
	case *opCancel:
		if a.book != nil {
			a.deliver(a.book.cancel(o.tok, time.Now()))
		}
	case *opWrite:
		o.reply <- a.write(o)
	case *opClose:
		o.reply <- a.close()
	default:
		// NB: the set is sealed; this is a programming error, not input.
		panic(fmt.Sprintf("nixl: unknown message %T", o))
	}
	a.flush()
}

func (a *actor) register(r rdma.Region) error {
	if a.book != nil {
		return errors.New("nixl: Register called twice")
	}
	// NB: NIXL moves slots through descriptor lists prepared once, at one
	// slot size: the slots of a pool's other block sizes are not ours to
	// move (a call naming one is refused, ErrBadSlot; the block is
	// recomputed by its engine).
	r = r.Grid()
	if r.SlotBytes <= 0 || r.Slots <= 0 || len(r.Base) < r.Slots*r.SlotBytes {
		return fmt.Errorf("nixl: register: region of %d bytes cannot hold %d slots of %d: %w", len(r.Base), r.Slots, r.SlotBytes, rdma.ErrBadSlot)
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(r.Base)))
	size := r.Slots * r.SlotBytes
	if st := C.kvn_register(a.api, a.agent, a.backend, C.uintptr_t(base), C.size_t(size), false); st != 0 {
		return callErr("register_mem", st, rdma.ErrUnavailable)
	}
	a.region, a.base = r, base
	if st := C.kvn_prep_slots(a.api, a.agent, a.backend, a.empty(), C.uintptr_t(base), C.size_t(r.SlotBytes), C.size_t(r.Slots), &a.local); st != 0 {
		return callErr("prep_xfer_dlist (local)", st, rdma.ErrUnavailable)
	}
	var data unsafe.Pointer
	var n C.size_t
	if st := C.kvn_get_local_md(a.api, a.agent, &data, &n); st != 0 {
		return callErr("get_local_md", st, rdma.ErrUnavailable)
	}
	md := C.GoBytes(data, C.int(n))
	C.free(data)
	meta := encodeMeta(peerMeta{Agent: a.t.info.Agent, SlotBytes: r.SlotBytes, Slots: r.Slots, Base: uint64(base), NixlMD: md})
	a.t.meta.Store(&meta)
	a.book = newBook(r.SlotBytes, r.Slots, a.t.cfg.LateWriteGrace)
	return nil
}

var emptyName = C.CString("") // NIXL_INIT_AGENT: the local side of prep_xfer_dlist

func (a *actor) empty() *C.char { return emptyName }

func (a *actor) connect(peer string, raw []byte) error {
	if a.book == nil {
		return fmt.Errorf("nixl: connect %s: %w", peer, rdma.ErrNotRegistered)
	}
	m, err := decodeMeta(raw)
	if err != nil {
		return fmt.Errorf("nixl: connect %s: %w", peer, err)
	}
	if m.SlotBytes != a.region.SlotBytes {
		return fmt.Errorf("nixl: connect %s: its slots are %d bytes, ours %d: %w", peer, m.SlotBytes, a.region.SlotBytes, rdma.ErrProtocol)
	}
	if m.Agent == a.t.info.Agent {
		return fmt.Errorf("nixl: connect %s: agent name %q is our own: %w", peer, m.Agent, rdma.ErrProtocol)
	}
	for _, r := range a.peers {
		if r.peer != peer && r.meta.Agent == m.Agent {
			return fmt.Errorf("nixl: connect %s: agent %q already belongs to peer %s: %w", peer, m.Agent, r.peer, rdma.ErrProtocol)
		}
	}
	if _, ok := a.peers[peer]; ok {
		a.disconnect(peer, fmt.Errorf("nixl: peer %s reconnected: %w", peer, rdma.ErrPeerGone))
	}
	var cname *C.char
	md := C.CBytes(m.NixlMD)
	st := C.kvn_load_remote_md(a.api, a.agent, md, C.size_t(len(m.NixlMD)), &cname)
	C.free(md)
	if st != 0 {
		return callErr("load_remote_md", st, rdma.ErrProtocol)
	}
	r := &remote{peer: peer, agent: cname, meta: m}
	if got := C.GoString(cname); got != m.Agent {
		a.forget(r)
		return fmt.Errorf("nixl: connect %s: NIXL metadata names agent %q, envelope %q: %w", peer, got, m.Agent, rdma.ErrProtocol)
	}
	if st := C.kvn_prep_slots(a.api, a.agent, a.backend, cname, C.uintptr_t(m.Base), C.size_t(m.SlotBytes), C.size_t(m.Slots), &r.handle); st != 0 {
		a.forget(r)
		return callErr("prep_xfer_dlist (remote "+peer+")", st, rdma.ErrProtocol)
	}
	a.peers[peer] = r
	m.NixlMD = nil // no longer needed
	r.meta = m
	a.book.connect(peer, m.Agent)
	return nil
}

// forget releases r's prepared list and the agent's copy of its metadata
// (which closes the UCX endpoints to it).
func (a *actor) forget(r *remote) {
	if r.handle != nil {
		C.kvn_release_dlist(a.api, a.agent, r.handle)
		r.handle = nil
	}
	if r.agent != nil {
		C.kvn_invalidate_remote_md(a.api, a.agent, r.agent)
		C.free(unsafe.Pointer(r.agent))
		r.agent = nil
	}
}

// disconnect fails peer's writes now (their requests are released: UCX
// sends nothing more) and starts releasing its expectations (book).
func (a *actor) disconnect(peer string, err error) {
	for req, w := range a.writes {
		if w.peer == peer {
			a.finishWrite(req, w, err)
		}
	}
	if r, ok := a.peers[peer]; ok {
		a.forget(r)
		delete(a.peers, peer)
	}
	if a.book != nil {
		a.deliver(a.book.disconnect(peer, time.Now()))
	}
}

func (a *actor) expect(o *opExpect) error {
	if a.book == nil {
		return fmt.Errorf("nixl: expect: %w", rdma.ErrNotRegistered)
	}
	return a.book.expect(o.peer, o.tok, o.dst, o.lens, o.done)
}

func (a *actor) write(o *opWrite) error {
	if a.book == nil {
		return fmt.Errorf("nixl: write: %w", rdma.ErrNotRegistered)
	}
	if o.done == nil {
		return fmt.Errorf("nixl: write %v: nil done", o.tok)
	}
	r, ok := a.peers[o.peer]
	if !ok {
		return fmt.Errorf("nixl: write %v to %s: %w", o.tok, o.peer, rdma.ErrPeerUnknown)
	}
	if len(o.src) != len(o.dst) || len(o.src) == 0 {
		return fmt.Errorf("nixl: write %v: %d src slots, %d dst slots: %w", o.tok, len(o.src), len(o.dst), rdma.ErrBadSlot)
	}
	if !a.region.Valid(o.src) {
		return fmt.Errorf("nixl: write %v: local slot out of %d: %w", o.tok, a.region.Slots, rdma.ErrBadSlot)
	}
	for _, s := range o.dst {
		if s < 0 || s >= r.meta.Slots {
			return fmt.Errorf("nixl: write %v: remote slot %d of %d: %w", o.tok, s, r.meta.Slots, rdma.ErrBadSlot)
		}
	}
	// NB: the remote slots are pre-registered at our slot size (Connect
	// refuses a peer whose size differs), so a WRITE moves whole slots: a
	// block shorter than its slot carries the slot's tail along. The
	// lengths are checked and counted, not used to cut the transfer.
	lens, err := rdma.Lengths(o.lens, len(o.src), a.region.SlotBytes, a.region.SlotBytes)
	if err != nil {
		return fmt.Errorf("nixl: write %v: %w", o.tok, err)
	}
	src, dst := cInts(o.src), cInts(o.dst)
	msg := encodeNotif(notif{Token: o.tok, Count: len(o.dst), Digest: slotDigest(o.dst)})
	var req C.kvn_h
	var posted C.bool
	st := C.kvn_write(a.api, a.agent, a.backend, a.local, &src[0], r.handle, &dst[0], C.size_t(len(src)),
		unsafe.Pointer(&msg[0]), C.size_t(len(msg)), &req, &posted)
	w := &pendingWrite{peer: o.peer, tok: o.tok, bytes: rdma.Sum(lens), done: o.done,
		deadline: time.Now().Add(a.t.cfg.WriteTimeout)}
	switch {
	case req == nil:
		return callErr("make_xfer_req", st, rdma.ErrPeerGone)
	case st < 0:
		// Accepted but failed at once: report through done, as a transfer.
		a.finishWrite(req, w, callErr("post_xfer_req", st, rdma.ErrPeerGone))
	case st == 0:
		a.finishWrite(req, w, nil)
	default: // in progress
		a.writes[req] = w
	}
	return nil
}

func cInts(s []int) []C.int {
	out := make([]C.int, len(s))
	for i, v := range s {
		out[i] = C.int(v)
	}
	return out
}

// finishWrite releases req and delivers w's completion.
func (a *actor) finishWrite(req C.kvn_h, w *pendingWrite, err error) {
	delete(a.writes, req)
	C.kvn_release_req(a.api, a.agent, req)
	c := rdma.Completion{Token: w.tok, Peer: w.peer, Err: err}
	if err == nil {
		c.Bytes = w.bytes
		a.t.st.writesOK.Add(1)
		a.t.st.bytesSent.Add(uint64(w.bytes))
	} else {
		a.t.st.writesFailed.Add(1)
	}
	a.out = append(a.out, completion{done: w.done, c: c})
}

// progress checks every write and, when expectations wait, collects the
// notifications; both drive UCX progress. It reports whether anything
// completed.
func (a *actor) progress(now time.Time) bool {
	n := len(a.writes)
	for req, w := range a.writes {
		switch st := C.kvn_xfer_status(a.api, a.agent, req); {
		case st == 0:
			a.finishWrite(req, w, nil)
		case st < 0:
			a.finishWrite(req, w, callErr("get_xfer_status", st, rdma.ErrPeerGone))
		case now.After(w.deadline):
			a.finishWrite(req, w, fmt.Errorf("nixl: write %v to %s not complete after %v: %w", w.tok, w.peer, a.t.cfg.WriteTimeout, rdma.ErrPeerGone))
		}
	}
	done := len(a.writes) < n
	if a.book != nil && a.book.pending() > 0 {
		if a.drainNotifs() {
			done = true
		}
		if cs := a.book.expire(now); len(cs) > 0 {
			a.deliver(cs)
			done = true
		}
	}
	return done
}

// drainNotifs fetches and handles the notifications NIXL has received.
func (a *actor) drainNotifs() bool {
	if st := C.kvn_get_notifs(a.api, a.agent, a.notifs); st != 0 {
		return false // NB: transient; the next round tries again
	}
	var agents C.size_t
	if C.kvn_notif_map_size(a.api, a.notifs, &agents) != 0 || agents == 0 {
		return false
	}
	any := false
	for i := C.size_t(0); i < agents; i++ {
		var name *C.char
		if C.kvn_notif_agent_at(a.api, a.notifs, i, &name) != 0 {
			continue
		}
		agent := C.GoString(name)
		var k C.size_t
		if C.kvn_notifs_size(a.api, a.notifs, name, &k) != 0 {
			continue
		}
		for j := C.size_t(0); j < k; j++ {
			var data unsafe.Pointer
			var n C.size_t
			if C.kvn_notif(a.api, a.notifs, name, j, &data, &n) != 0 {
				continue
			}
			var msg []byte
			if n <= notifLen { // anything longer is not ours: refused without copying
				msg = C.GoBytes(data, C.int(n))
			}
			a.deliver(a.book.notified(agent, msg))
			any = true
		}
	}
	C.kvn_notif_map_clear(a.api, a.notifs)
	return any
}

// deliver queues completions for flush.
func (a *actor) deliver(cs []completion) { a.out = append(a.out, cs...) }

// flush publishes the counters, then hands the queued completions to the
// dispatcher: a done callback that reads Stats sees its own transfer
// counted and no longer pending.
func (a *actor) flush() {
	a.publish()
	if len(a.out) > 0 {
		a.t.disp.push(a.out...)
		a.out = nil
	}
}

// close fails everything, tears the agent down, and stops the loop. After
// the agent is destroyed nothing can write into the pool, so expectations
// complete at once.
func (a *actor) close() error {
	a.closed = true
	for req, w := range a.writes {
		a.finishWrite(req, w, fmt.Errorf("nixl: %w", rdma.ErrClosed))
	}
	a.destroy()
	if a.book != nil {
		a.deliver(a.book.closeAll(fmt.Errorf("nixl: %w", rdma.ErrClosed)))
	}
	return nil
}

// publish mirrors the counters Stats reads.
func (a *actor) publish() {
	a.t.st.pendingWrites.Store(int64(len(a.writes)))
	if b := a.book; b != nil {
		a.t.st.pendingExpects.Store(int64(b.pending()))
		a.t.st.expectsOK.Store(b.okCount)
		a.t.st.expectsFailed.Store(b.failed)
		a.t.st.refused.Store(b.refused)
		a.t.st.bytesReceived.Store(b.bytesIn)
	}
}
