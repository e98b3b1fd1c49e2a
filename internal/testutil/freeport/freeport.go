// Package freeport picks loopback TCP ports for processes that must be
// told their port before they bind it: a daemon restarted on the same
// address, peers that name each other, a test server whose command line
// takes a port.
//
// It picks below the kernel's ephemeral range. A port found with
// Listen(":0") is an ephemeral one, and any connection on the machine
// (another test package's, running at the same time) may take it as its
// local port between the pick and the bind: "address already in use". A
// port below the range is taken only by an explicit bind, which the pick
// checks for.
//
// It owns no state; it never holds a port past Ports' return.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// lowest is the smallest port picked.
const lowest = 10000

// Ports returns n distinct loopback TCP ports free now.
func Ports(n int) ([]int, error) {
	hi := ephemeralLow()
	if hi-lowest < 1000 {
		return listenZero(n) // NB: no room below the range: the old way
	}
	var ports []int
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries > 100*n {
			return nil, fmt.Errorf("freeport: no free port in %d..%d after %d tries", lowest, hi-1, tries)
		}
		p := lowest + rand.IntN(hi-lowest)
		l, err := net.Listen("tcp", Loopback(p))
		if err != nil {
			continue // taken: another
		}
		held = append(held, l) // NB: held until all are picked, so they differ
		ports = append(ports, p)
	}
	return ports, nil
}

// Port returns one loopback TCP port free now.
func Port() (int, error) {
	p, err := Ports(1)
	if err != nil {
		return 0, err
	}
	return p[0], nil
}

// Addr returns a loopback TCP address, 127.0.0.1:port, whose port is free
// now: what a test hands a process that must be told where to listen.
func Addr() (string, error) {
	p, err := Port()
	if err != nil {
		return "", err
	}
	return Loopback(p), nil
}

// Loopback is the address of port on 127.0.0.1, the interface the ports
// are picked on.
func Loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// ephemeralLow is the kernel's first ephemeral port (32768 when it cannot
// be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return lo
}

func listenZero(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("freeport: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
