package freeport

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// The ports are distinct, below the ephemeral range, and bindable once
// returned.
func TestPortsAreDistinctBelowTheEphemeralRangeAndFree(t *testing.T) {
	ports, err := Ports(20)
	require.NoError(t, err)
	seen := map[int]bool{}
	for _, p := range ports {
		require.False(t, seen[p], "port %d twice", p)
		seen[p] = true
		require.GreaterOrEqual(t, p, lowest)
		require.Less(t, p, ephemeralLow())
		l, err := net.Listen("tcp", Loopback(p))
		require.NoError(t, err, "port %d is free", p)
		require.NoError(t, l.Close())
	}
}

// A port someone listens on is never picked.
func TestPortsSkipsATakenPort(t *testing.T) {
	held := make([]net.Listener, 0, 50)
	taken := map[int]bool{}
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	ports, err := Ports(50)
	require.NoError(t, err)
	for _, p := range ports {
		l, err := net.Listen("tcp", Loopback(p))
		require.NoError(t, err)
		held = append(held, l)
		taken[p] = true
	}
	again, err := Ports(50)
	require.NoError(t, err)
	for _, p := range again {
		require.False(t, taken[p], "port %d is held, yet picked", p)
	}
}
