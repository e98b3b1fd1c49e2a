package kvtier_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/wire"
)

// pipeline is an engine connection that sends calls without waiting for
// their replies (as vLLM's connector sends a step's calls) and reads the
// replies in the order they come.
type pipeline struct {
	t    *testing.T
	send func([]byte) error
	recv func() ([]byte, error)
	id   uint64
}

func (p *pipeline) call(q *wire.Request) uint64 {
	p.t.Helper()
	p.id++
	q.ID = p.id
	require.NoError(p.t, p.send(wire.EncodeRequest(q)))
	return q.ID
}

// reply reads the next frame: it must answer call id, with no error.
func (p *pipeline) reply(id uint64, op wire.Op) *wire.Reply {
	p.t.Helper()
	frame, err := p.recv()
	require.NoError(p.t, err)
	rp, err := wire.DecodeReply(frame, op)
	require.NoError(p.t, err)
	require.Equal(p.t, id, rp.ID, "the next frame answers %s (a quiet call before it failed?)", op)
	require.Nil(p.t, rp.Err, "%s answered an error", op)
	return rp
}

func dialPipeline(t *testing.T, addr string) *pipeline {
	t.Helper()
	p := &pipeline{t: t}
	if path, ok := strings.CutPrefix(addr, "unix://"); ok {
		c, err := net.Dial("unix", path)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		p.send = func(b []byte) error { return wire.WriteFrame(c, b) }
		p.recv = func() ([]byte, error) {
			if err := c.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
				return nil, err
			}
			return wire.ReadFrame(c)
		}
	} else {
		sock := zmq4.NewDealer(context.Background(), zmq4.WithDialerMaxRetries(0))
		require.NoError(t, sock.Dial(addr))
		t.Cleanup(func() { _ = sock.Close() })
		p.send = func(b []byte) error { return sock.Send(zmq4.NewMsg(b)) }
		p.recv = func() ([]byte, error) {
			m, err := sock.Recv()
			if err != nil {
				return nil, err
			}
			return m.Frames[0], nil
		}
	}
	p.reply(p.call(&wire.Request{Op: wire.OpHello, Client: "pipelined"}), wire.OpHello)
	return p
}

// A load pipelined right behind its own quiet complete_store — and the
// load's completion and both requests' ends right behind it — takes effect
// in the order sent, 1,000 times of 1,000 on each transport: the load finds
// the blocks committed although their checksum runs off the bridge's
// mailbox, no quiet call fails, and nothing of any request is left.
func TestALoadPipelinedBehindItsCommitFindsTheBlocks(t *testing.T) {
	for _, transport := range []string{"unix", "ipc"} {
		t.Run(transport, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			node, _ := openEngineNode(t, ctx, transport, 64)
			p := dialPipeline(t, node.EngineAddr())
			for i := range 1000 {
				ks := sessionKeys(2*i+1, 2*i+2)
				w := &messages.ReqContext{RequestID: fmt.Sprint("w", i)}
				r := &messages.ReqContext{RequestID: fmt.Sprint("r", i)}
				plan := p.reply(p.call(&wire.Request{Op: wire.OpPrepareStore, Req: w, Keys: ks}), wire.OpPrepareStore)
				require.Equal(t, ks, plan.ToStore, "round %d: both blocks to store", i)
				p.call(&wire.Request{Op: wire.OpCompleteStore, Req: w, Keys: ks, OK: true, Quiet: true})
				load := p.call(&wire.Request{Op: wire.OpPrepareLoad, Req: r, Keys: ks})
				p.call(&wire.Request{Op: wire.OpCompleteLoad, Req: r, Keys: ks, Quiet: true})
				p.call(&wire.Request{Op: wire.OpRequestFinished, Req: r, Quiet: true})
				p.call(&wire.Request{Op: wire.OpRequestFinished, Req: w, Quiet: true})
				rp := p.reply(load, wire.OpPrepareLoad)
				require.Len(t, rp.Slots, 2, "round %d: the load found both blocks", i)
			}
			// NB: a barrier: answered once every call before it took effect.
			p.reply(p.call(&wire.Request{Op: wire.OpHasPendingWork}), wire.OpHasPendingWork)
			st, err := node.Manager().Stats(ctx)
			require.NoError(t, err)
			require.Zero(t, st.Requests, "no request state left")
			require.Zero(t, st.JobsInFlight)
			require.Zero(t, st.Pinned)
			require.Zero(t, st.Leased)
			require.Zero(t, st.WritePending)
		})
	}
}
