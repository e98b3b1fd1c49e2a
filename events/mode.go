package events

import (
	"fmt"
	"net"
	"strings"
)

// How a socket opens its address: it binds it (and peers connect to it) or
// connects to a peer that bound it. ZeroMQ lets either end of a PUB/SUB
// pair bind; the topology decides which:
//
//   - a router that reads many engines' events (llm-d's EPP) binds one SUB
//     and every engine's PUB connects to it (vLLM: endpoint
//     tcp://<router>:5557), so the node's PUB must connect too;
//   - an engine configured to connect its PUB (as above) needs the node's
//     learning SUB (learn_from) to bind.
//
// The replay ROUTER always binds: its clients connect to ask.
const (
	ModeBind    = "bind"    // bind the address
	ModeConnect = "connect" // connect to the address
	// ModeAuto decides from the address as vLLM does (VLLMBinds).
	ModeAuto = "auto"
)

// VLLMBinds is vLLM's rule for its KV events publisher
// (vllm/distributed/kv_events.py, ZmqEventPublisher._is_bind_endpoint, as
// of 0.32): it binds a wildcard address (one with "*" or "::") and every
// ipc:// or inproc:// address, and connects to the rest. So an operator
// writes kvtierd's events endpoint exactly as vLLM's kv_events_config
// endpoint: "tcp://*:5557" binds, "tcp://epp:5557" connects.
func VLLMBinds(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

// PublisherBinds reports whether the node's PUB binds endpoint in mode
// ("" is ModeBind; ModeAuto is VLLMBinds). A wildcard cannot be connected to.
func PublisherBinds(mode, endpoint string) (bool, error) {
	switch mode {
	case "", ModeBind:
		return true, nil
	case ModeAuto:
		return VLLMBinds(endpoint), nil
	case ModeConnect:
		return false, connectable(endpoint)
	}
	return false, badMode(mode)
}

// SubscriberBinds reports whether a SUB (a learn_from subscriber, or
// `kvtier events tail`) binds endpoint in mode ("" is ModeConnect). In
// ModeAuto it is the other end of VLLMBinds: it binds a tcp address whose
// host is a wildcard ("*", "::": engines whose endpoint names this host
// connect to it) and connects to anything else — an engine binds every
// ipc:// address, and a tcp address with a host (tcp://[::1]:5557
// included) is where an engine bound.
func SubscriberBinds(mode, endpoint string) (bool, error) {
	switch mode {
	case ModeBind:
		return true, nil
	case ModeAuto:
		return wildcard(endpoint), nil
	case "", ModeConnect:
		return false, connectable(endpoint)
	}
	return false, badMode(mode)
}

// wildcard reports whether endpoint is tcp:// on every interface.
func wildcard(endpoint string) bool {
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return false
	}
	host, _, err := net.SplitHostPort(addr)
	return err == nil && (host == "*" || host == "::")
}

func connectable(endpoint string) error {
	if wildcard(endpoint) {
		return fmt.Errorf("%w: cannot connect to the wildcard address %s (bind it, or name the host)", ErrBadConfig, endpoint)
	}
	return nil
}

func badMode(mode string) error {
	return fmt.Errorf("%w: socket mode %q (want %s, %s or %s)", ErrBadConfig, mode, ModeBind, ModeConnect, ModeAuto)
}
