package chaos

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A subscriber stopped twice (a node whose peer-kill restart failed is
// stopped at its kill and at the end of the run) returns at once the
// second time; it used to wait forever for a result already taken.
func TestSubscriberStopsTwice(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never speaks
	require.NoError(t, err)
	defer ln.Close()
	s := subscribe("tcp://"+ln.Addr().String(), "")
	first := s.stop()
	done := make(chan error, 1)
	go func() { done <- s.stop() }()
	select {
	case err := <-done:
		require.Equal(t, first, err, "the same result")
	case <-time.After(10 * time.Second): // a liveness bound: the bug waits forever
		t.Fatal("the second stop hung")
	}
}
