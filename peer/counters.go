package peer

import (
	"sort"
	"sync"
	"sync/atomic"

	"github.com/kvtier/kvtier/messages"
)

// Counters are the control plane's counters: per peer, and per reason for
// everything refused or dropped. They are atomics written by the session
// that owns the event and read by metrics at any time; no actor state.
type Counters struct {
	mu      sync.Mutex
	peers   map[string]*peerCounters
	dropped sync.Map // reason → *atomic.Uint64: frames dropped (malformed, stale epoch, unknown round, …)
	refused sync.Map // reason → *atomic.Uint64: handshakes refused (auth, not_allowed, version, …)
}

type peerCounters struct {
	ready, serving              atomic.Bool
	lookups, hits               atomic.Uint64
	fetched, fetchBytes         atomic.Uint64
	failures, corrupt, served   atomic.Uint64
	fetchNanos, fetches, resets atomic.Uint64
}

// NewCounters returns empty counters.
func NewCounters() *Counters { return &Counters{peers: map[string]*peerCounters{}} }

func (c *Counters) peer(node string) *peerCounters {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.peers[node]
	if p == nil {
		p = &peerCounters{}
		c.peers[node] = p
	}
	return p
}

func (c *Counters) drop(reason string) { counter(&c.dropped, reason).Add(1) }

func (c *Counters) refuse(reason string) { counter(&c.refused, reason).Add(1) }

func counter(m *sync.Map, reason string) *atomic.Uint64 {
	if v, ok := m.Load(reason); ok {
		return v.(*atomic.Uint64)
	}
	v, _ := m.LoadOrStore(reason, &atomic.Uint64{})
	return v.(*atomic.Uint64)
}

// Dropped is a snapshot of frames dropped, by reason.
func (c *Counters) Dropped() map[string]uint64 { return snapshot(&c.dropped) }

// Refused is a snapshot of handshakes refused, by reason.
func (c *Counters) Refused() map[string]uint64 { return snapshot(&c.refused) }

func snapshot(m *sync.Map) map[string]uint64 {
	out := map[string]uint64{}
	m.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Uint64).Load()
		return true
	})
	return out
}

// Peers is a snapshot of every peer's counters, by node id.
func (c *Counters) Peers() []messages.PeerStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]messages.PeerStats, 0, len(c.peers))
	for node, p := range c.peers {
		out = append(out, messages.PeerStats{
			Node: node, Ready: p.ready.Load(), Serving: p.serving.Load(),
			Lookups: p.lookups.Load(), Hits: p.hits.Load(),
			Fetched: p.fetched.Load(), FetchBytes: p.fetchBytes.Load(),
			Failures: p.failures.Load(), Corrupt: p.corrupt.Load(), Served: p.served.Load(),
			FetchNanos: p.fetchNanos.Load(), Fetches: p.fetches.Load(), Resets: p.resets.Load(),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}
