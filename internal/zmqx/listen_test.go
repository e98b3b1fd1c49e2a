package zmqx

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
)

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
