//go:build nixl && cgo

package nixl

/*
#include <stdlib.h>
#include "kvn.h"
*/
import "C"

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvtier/kvtier/rdma"
)

// Built reports whether this binary carries the NIXL transport.
const Built = true

// Transport is rdma.Transport over NIXL. Its exported methods post typed
// messages to one actor goroutine locked to its OS thread, which alone
// calls NIXL for this agent.
type Transport struct {
	cfg  Config
	info Info

	mbox    chan op
	exited  chan struct{} // closed when the actor has returned
	disp    *dispatcher
	closing sync.Once

	meta atomic.Pointer[[]byte]
	st   counters
}

var _ rdma.Transport = (*Transport)(nil)

// counters mirror the actor's state for Stats (which must not wait on it).
type counters struct {
	bytesSent, bytesReceived          atomic.Uint64
	writesOK, writesFailed            atomic.Uint64
	expectsOK, expectsFailed, refused atomic.Uint64
	pendingExpects, pendingWrites     atomic.Int64
}

// New loads the library, creates the agent and its backend on a fresh
// locked OS thread, and returns the transport. Any failure to get there
// (library missing or incompatible, backend plugin missing, UCX refusing to
// start) is an error wrapping rdma.ErrUnavailable; nothing crashes.
func New(cfg Config) (rdma.Transport, error) {
	t, err := newTransport(cfg)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// Probe loads the library and starts (then closes) one agent with its
// backend: the check a node runs before it announces transport: nixl.
func Probe(cfg Config) (Info, error) {
	t, err := newTransport(cfg)
	if err != nil {
		return Info{}, err
	}
	info := t.info
	return info, t.Close()
}

func newTransport(cfg Config) (*Transport, error) {
	cfg = cfg.withDefaults()
	path := cfg.libraryPath(getenv)
	setPluginDir(cfg.PluginDir)
	lib, err := loadLibrary(path)
	if err != nil {
		return nil, err
	}
	t := &Transport{
		cfg:    cfg,
		mbox:   make(chan op, 256),
		exited: make(chan struct{}),
		disp:   newDispatcher(),
		info: Info{
			Library: lib.loaded, Version: lib.version, Backend: cfg.Backend,
			Agent: cfg.Name + "-" + randomSuffix(),
		},
	}
	a := &actor{t: t, lib: lib, api: lib.api, peers: map[string]*remote{}, writes: map[C.kvn_h]*pendingWrite{}}
	ready := make(chan error, 1)
	go a.run(ready)
	if err := <-ready; err != nil {
		<-t.exited
		t.disp.stop()
		return nil, err
	}
	return t, nil
}

// Info describes the library and agent in use, for the startup log line.
func (t *Transport) Info() Info { return t.info }

func randomSuffix() string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("nixl: no randomness: " + err.Error()) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

// ---- the public face: each method is one message to the actor ----

func (t *Transport) Kind() string { return Kind }

func (t *Transport) Register(r rdma.Region) error {
	return t.ask(&opRegister{region: r, reply: make(chan error, 1)})
}

func (t *Transport) Metadata() []byte {
	if p := t.meta.Load(); p != nil {
		return append([]byte(nil), (*p)...)
	}
	return nil
}

func (t *Transport) Connect(peer string, meta []byte) error {
	return t.ask(&opConnect{peer: peer, meta: append([]byte(nil), meta...), reply: make(chan error, 1)})
}

func (t *Transport) Disconnect(peer string) { t.tell(&opDisconnect{peer: peer}) }

func (t *Transport) Expect(peer string, tok rdma.Token, dst, lens []int, done func(rdma.Completion)) error {
	return t.ask(&opExpect{peer: peer, tok: tok, dst: append([]int(nil), dst...), lens: append([]int(nil), lens...), done: done, reply: make(chan error, 1)})
}

func (t *Transport) Cancel(tok rdma.Token) { t.tell(&opCancel{tok: tok}) }

func (t *Transport) Write(peer string, tok rdma.Token, src, dst, lens []int, done func(rdma.Completion)) error {
	return t.ask(&opWrite{peer: peer, tok: tok, src: append([]int(nil), src...), dst: append([]int(nil), dst...), lens: append([]int(nil), lens...), done: done, reply: make(chan error, 1)})
}

func (t *Transport) Stats() rdma.Stats {
	return rdma.Stats{
		Kind:           Kind,
		BytesSent:      t.st.bytesSent.Load(),
		BytesReceived:  t.st.bytesReceived.Load(),
		WritesOK:       t.st.writesOK.Load(),
		WritesFailed:   t.st.writesFailed.Load(),
		ExpectsOK:      t.st.expectsOK.Load(),
		ExpectsFailed:  t.st.expectsFailed.Load(),
		Refused:        t.st.refused.Load(),
		PendingExpects: int(t.st.pendingExpects.Load()),
		PendingWrites:  int(t.st.pendingWrites.Load()),
	}
}

// Close fails everything pending (ErrClosed), deregisters the pool,
// destroys the agent, and returns once the actor and the completion
// goroutine have ended. It must not be called from a done callback.
func (t *Transport) Close() error {
	var err error
	t.closing.Do(func() {
		reply := make(chan error, 1)
		select {
		case t.mbox <- &opClose{reply: reply}:
			err = <-reply
		case <-t.exited:
		}
		<-t.exited
		t.disp.stop()
	})
	return err
}

// ask sends o and waits for the actor's answer (never on the network: the
// actor answers after its local NIXL calls).
func (t *Transport) ask(o replier) error {
	select {
	case t.mbox <- o:
	case <-t.exited:
		return fmt.Errorf("nixl: %w", rdma.ErrClosed)
	}
	select {
	case err := <-o.replyCh():
		return err
	case <-t.exited:
		// The actor may have answered just before it exited.
		select {
		case err := <-o.replyCh():
			return err
		default:
			return fmt.Errorf("nixl: %w", rdma.ErrClosed)
		}
	}
}

// tell sends o without waiting for an answer.
func (t *Transport) tell(o op) {
	select {
	case t.mbox <- o:
	case <-t.exited:
	}
}

// ---- messages (a sealed set) ----

type op interface{ isOp() }

type replier interface {
	op
	replyCh() chan error
}

type opRegister struct {
	region rdma.Region
	reply  chan error
}
type opConnect struct {
	peer  string
	meta  []byte
	reply chan error
}
type opDisconnect struct{ peer string }
type opExpect struct {
	peer  string
	tok   rdma.Token
	dst   []int
	lens  []int // nil: whole slots
	done  func(rdma.Completion)
	reply chan error
}
type opCancel struct{ tok rdma.Token }
type opWrite struct {
	peer     string
	tok      rdma.Token
	src, dst []int
	lens     []int // nil: whole slots
	done     func(rdma.Completion)
	reply    chan error
}
type opClose struct{ reply chan error }

func (*opRegister) isOp()   {}
func (*opConnect) isOp()    {}
func (*opDisconnect) isOp() {}
func (*opExpect) isOp()     {}
func (*opCancel) isOp()     {}
func (*opWrite) isOp()      {}
func (*opClose) isOp()      {}

func (o *opRegister) replyCh() chan error { return o.reply }
func (o *opConnect) replyCh() chan error  { return o.reply }
func (o *opExpect) replyCh() chan error   { return o.reply }
func (o *opWrite) replyCh() chan error    { return o.reply }
