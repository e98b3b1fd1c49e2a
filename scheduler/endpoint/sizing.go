package endpoint

import (
	"context"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/wire"
)

// Sizing a pool from the first engine: a daemon started with no block
// size serves its engine address before the node exists, answers every
// frame SIZING, and takes the bytes per block of the first hello that
// declares them. Then the socket closes (its file removed), the node opens
// with slots of that size on the same address, and the engine, which
// reconnects after any failed hello, finds a session there.

// SlotAlign is what a declared block size is rounded up to: a slot starts
// on a page, whatever the engine's layout.
const SlotAlign = 4096

// AwaitBlockBytes serves o until an engine's hello declares its bytes per
// block, and returns them rounded up to SlotAlign; or ctx's error. The
// socket is closed before it returns.
func AwaitBlockBytes(ctx context.Context, o ListenOptions, log zerolog.Logger) (int, error) {
	got := make(chan int, 1)
	ln, err := listen(o, log, func(string) {})
	if err != nil {
		return 0, err
	}
	served := make(chan error, 1)
	go func() {
		served <- ln.sock.serve(func(in inFrame) { answerSizing(ln, in, got) })
	}()
	var n int
	select {
	case n = <-got:
	case <-ctx.Done():
		err = ctx.Err()
	}
	closeErr := ln.close()
	<-served // NB: serve returns once its socket is closed
	if err != nil {
		return 0, err
	}
	if closeErr != nil {
		return 0, fmt.Errorf("engine endpoint: closing the sizing socket: %w", closeErr)
	}
	return n, nil
}

// answerSizing answers one frame SIZING, offering a hello's declared block
// size to got (the first one wins; got never blocks: it holds one).
func answerSizing(ln *listener, in inFrame, got chan<- int) {
	if in.parts != 1 {
		return
	}
	q, err := wire.DecodeRequest(in.body)
	if err != nil {
		_ = ln.sock.send(in.peer, wire.EncodeError(0, err))
		return
	}
	msg := fmt.Errorf("%w: kvtierd at %s sizes its slots from the first engine that declares its bytes per block "+
		"(hello block_bytes); start one, or start kvtierd with --block-bytes", messages.ErrSizing, ln.addr)
	n := 0
	if q.Op == wire.OpHello && q.BlockBytes > 0 {
		n = roundUp(q.BlockBytes, SlotAlign)
		msg = fmt.Errorf("%w: kvtierd at %s sizes its slots to %d bytes for this engine (%q declared %d); say hello again",
			messages.ErrSizing, ln.addr, n, q.Client, q.BlockBytes)
	}
	if q.Op == wire.OpBatch || q.Replies() || q.RepliesOnError() {
		_ = ln.sock.send(in.peer, wire.EncodeCallError(q.ID, q.Op, msg))
	}
	if n > 0 {
		// NB: after the answer is sent: the wait closes the socket.
		select {
		case got <- n:
		default:
		}
	}
}

func roundUp(n, to int) int { return (n + to - 1) / to * to }
