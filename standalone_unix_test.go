package kvtier_test

import (
	"context"
	"encoding/binary"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/wire"
	"github.com/kvtier/kvtier/supervision"
)

// rawUnix is an engine speaking the unix:// transport by hand.
type rawUnix struct {
	t *testing.T
	c net.Conn
}

func (r *rawUnix) call(q *wire.Request) *wire.Reply {
	r.t.Helper()
	require.NoError(r.t, wire.WriteFrame(r.c, wire.EncodeRequest(q)))
	frame, err := wire.ReadFrame(r.c)
	require.NoError(r.t, err)
	rp, err := wire.DecodeReply(frame, q.Op)
	require.NoError(r.t, err)
	return rp
}

// Over unix:// a connection is an engine session: when it ends without a
// Bye, what the session held (write-pending slots, a store job) is released
// at once; a frame whose length prefix is out of bounds ends the connection
// (the stream cannot be resynchronised) and the node keeps serving others;
// the same with the connections polled between calls (engine_poll).
func TestUnixConnectionIsTheSession(t *testing.T) {
	t.Run("plain", func(t *testing.T) { testUnixConnectionIsTheSession(t, 0) })
	t.Run("polled", func(t *testing.T) { testUnixConnectionIsTheSession(t, 100*time.Microsecond) })
}

func testUnixConnectionIsTheSession(t *testing.T, poll time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clock := supervision.NewManualClock(time.Unix(1_700_000_000, 0))
	node := openEngineTestNode(t, ctx, "unix", kvtier.Config{EnginePoll: poll, Clock: clock})
	sock := strings.TrimPrefix(node.EngineAddr(), "unix://")
	dial := func() *rawUnix {
		c, err := net.Dial("unix", sock)
		require.NoError(t, err)
		return &rawUnix{t: t, c: c}
	}

	e := dial()
	hello := e.call(&wire.Request{Op: wire.OpHello, ID: 1, Client: "raw"})
	require.Nil(t, hello.Err)
	require.Equal(t, wire.Version, hello.Hello.Protocol)
	store := e.call(&wire.Request{Op: wire.OpPrepareStore, ID: 2, Req: &messages.ReqContext{RequestID: "w"}, Keys: sessionKeys(1, 2)})
	require.Nil(t, store.Err)
	s, err := node.Manager().Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, s.WritePending)
	require.NoError(t, e.c.Close()) // gone without a Bye

	require.Eventually(t, func() bool { // NB: a probe with a deadline, not a sleep
		st, err := node.Manager().Lookup(ctx, &messages.ReqContext{RequestID: "probe"}, sessionKeys(1), false)
		return err == nil && st[0] == messages.Miss
	}, 10*time.Second, time.Millisecond, "the session's writes were ended when its connection ended")
	s, err = node.Manager().Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, s.WritePending, "their slots stay out of use for the quarantine (a worker may still copy)")
	clock.Advance(10 * time.Second)
	s, err = node.Manager().Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, s.WritePending, "then they are freed")

	bad := dial()
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], wire.MaxFrameBytes+1)
	_, err = bad.c.Write(n[:])
	require.NoError(t, err)
	_, err = wire.ReadFrame(bad.c)
	require.Error(t, err, "the endpoint closes a stream it cannot frame")

	ok := dial()
	defer ok.c.Close()
	require.Nil(t, ok.call(&wire.Request{Op: wire.OpHello, ID: 1, Client: "after"}).Err, "the node keeps serving")
}
