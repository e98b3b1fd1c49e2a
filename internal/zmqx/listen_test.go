package zmqx

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ready is a NULL-mechanism handshake as a ZMTP 3 client sends it: the
// 64-byte greeting, then READY with the given metadata.
func ready(meta map[string]string, long bool) []byte {
	body := []byte{byte(len(zmtpReadyName))}
	body = append(body, zmtpReadyName...)
	for k, v := range meta {
		body = append(body, byte(len(k)))
		body = append(body, k...)
		body = binary.BigEndian.AppendUint32(body, uint32(len(v)))
		body = append(body, v...)
	}
	out := make([]byte, zmtpGreeting)
	if long {
		out = append(out, zmtpCommand|zmtpLong)
		out = binary.BigEndian.AppendUint64(out, uint64(len(body)))
	} else {
		out = append(out, zmtpCommand, byte(len(body)))
	}
	return append(out, body...)
}

func TestReadyIdentityReadsTheClientsIdentity(t *testing.T) {
	for _, long := range []bool{false, true} {
		hs := ready(map[string]string{"Socket-Type": "DEALER", "Identity": "engine-7"}, long)
		for n := 0; n < len(hs); n++ { // byte by byte, as reads may split it
			_, done := readyIdentity(hs[:n])
			assert.False(t, done, "undecided on %d of %d bytes", n, len(hs))
		}
		id, done := readyIdentity(hs)
		assert.True(t, done)
		assert.Equal(t, "engine-7", id)
	}
	id, done := readyIdentity(ready(map[string]string{"Socket-Type": "DEALER"}, false))
	assert.True(t, done)
	assert.Empty(t, id, "no Identity: the connection goes unwatched")
}

func FuzzReadyIdentity(f *testing.F) {
	f.Add(ready(map[string]string{"Identity": "x"}, false))
	f.Add(ready(map[string]string{"Identity": "x", "Socket-Type": "DEALER"}, true))
	f.Add(make([]byte, zmtpGreeting+2))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, done := readyIdentity(b)
		if !done && id != "" {
			t.Fatal("an identity before the READY command is whole")
		}
		if len(id) > len(b) {
			t.Fatal("an identity longer than the handshake")
		}
	})
}

// A connection that never speaks is never handed to zmq4's accept loop
// (which would run its handshake inline and hold every later connection):
// the first connection Accept returns is the one that sent its signature,
// with those bytes still to be read.
func TestListenerHandsOverOnlyConnectionsThatGreet(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := newWatchedListener(raw, nil)
	silent, err := net.Dial("tcp", raw.Addr().String())
	require.NoError(t, err)
	defer silent.Close()
	talker, err := net.Dial("tcp", raw.Addr().String())
	require.NoError(t, err)
	defer talker.Close()
	hs := ready(map[string]string{"Identity": "e1"}, false)
	_, err = talker.Write(hs)
	require.NoError(t, err)

	got, err := l.Accept()
	require.NoError(t, err)
	buf := make([]byte, len(hs))
	_, err = io.ReadFull(got, buf)
	require.NoError(t, err)
	assert.Equal(t, hs, buf, "the signature read ahead is replayed, then the rest")
	assert.Equal(t, "e1", got.(*watchedConn).identity)

	require.NoError(t, l.Close())
	_ = silent.SetReadDeadline(time.Now().Add(30 * time.Second)) // liveness bound only
	_, err = silent.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "Close ends a connection still waiting to greet")
	_, err = l.Accept()
	assert.ErrorIs(t, err, net.ErrClosed)
	require.NoError(t, got.Close())
}
