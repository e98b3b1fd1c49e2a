package peer

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/internal/defaults"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/rdma"
	"github.com/kvtier/kvtier/supervision"
)

// Addr is one statically configured peer.
type Addr struct {
	Node string // its node id (its DEALER identity, and what it proves in the handshake)
	Addr string // its control-plane ROUTER address, tcp://host:port
	// Events and EventsReplay are where it publishes its KV events, for the
	// P2P tier's directory ("" = unknown: the directory cannot vouch for it).
	Events, EventsReplay string
}

// Members is a source of discovered peers: the plane subscribes when it
// starts (again after a restart) and hears of them as MemberUp and
// MemberDown messages.
type Members interface {
	// Subscribe makes send the one way members reach the plane, replacing
	// any earlier one, and at once sends a MemberUp for every member known
	// now; nil unsubscribes. Neither Subscribe nor send may block: the
	// plane calls Subscribe from its Receive.
	Subscribe(send func(msg any))
}

// Config is what the plane and its sessions need from the node.
type Config struct {
	Node       string   // this node's id
	Listen     string   // ROUTER address to bind, tcp://host:port (port 0: any)
	Secret     []byte   // shared secret of the HMAC handshake; required
	Peers      []Addr   // peers to dial
	Allow      []string // node ids allowed to open sessions; empty: any node that proves the secret
	Namespaces []string // namespaces shared with peers; empty: any
	// BlockBytes is the bytes of a slot of the pool's grid (its first block
	// size): a block whose length a frame leaves out is this long.
	BlockBytes int
	// Slots bounds the pool's slot ids (every id is below it): with blocks
	// of several sizes, Region.IDLimit, else the grid's slots.
	Slots int
	// BlockSizes is, per namespace, the length of its blocks where they are
	// shorter than their slots (an embedder whose blocks do not fill a
	// slot); a namespace not listed has blocks as long as their slots.
	BlockSizes map[string]int

	// Members are the discovered peers (the node's etcd discovery), dialed
	// like Peers but only while they are members; nil: static peers only.
	Members Members

	Transport rdma.Transport // the data plane, registered on the pool
	Region    rdma.Region    // the registered pool: fetched blocks are fitted to its slots and verified in them
	// LargestSlot is the bytes of the largest slot our pool has now (its
	// block sizes come with its engines): a peer's hit longer than that is
	// a miss here. Nil: Region.MaxSlot (BlockBytes without a Region).
	LargestSlot func() int
	Offload     *actors.Offload // where those checksums run off the mailbox, tracked for the pool's unmapping (nil: untracked)
	CPU         *actor.PID      // the CPU tier
	Tier        *actor.PID      // the P2P tier, told of sessions becoming ready or going away
	JobSeq      *atomic.Uint64  // numbers producer-side pin jobs (OriginPeer) across sessions

	LeaseTTL          time.Duration // producer lease of a round's hits, until Fetch or Abort
	LookupTimeout     time.Duration // consumer: a Lookup round must be answered by then
	FetchTimeout      time.Duration // consumer: a Fetch round must complete by then
	HandshakeTimeout  time.Duration // consumer: Hello → Ready
	RetryMin          time.Duration // first redial backoff
	RetryMax          time.Duration // backoff cap
	HeartbeatInterval time.Duration // Ping period while a round of ours is in flight (none when idle); negative disables
	MaxMalformed      int           // malformed frames from one peer before its inbound session is dropped
	MaxSessions       int           // sessions (configured and inbound) before Hellos are refused
	SendQueue         int           // frames queued per socket writer before sends are dropped

	Clock supervision.Clock
	Log   zerolog.Logger
}

// Defaults for Config's zero fields.
const (
	DefaultLeaseTTL          = 30 * time.Second
	DefaultLookupTimeout     = time.Second
	DefaultFetchTimeout      = 10 * time.Second
	DefaultHandshakeTimeout  = 2 * time.Second
	DefaultRetryMin          = 100 * time.Millisecond
	DefaultRetryMax          = 5 * time.Second
	DefaultHeartbeatInterval = 2 * time.Second
	DefaultMaxMalformed      = 16
	DefaultMaxSessions       = 1024
	DefaultSendQueue         = 1024
)

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	// NB: Fill, not FillNonPositive, for the durations: a negative
	// HeartbeatInterval means no heartbeat.
	defaults.Fill(&c, Config{LeaseTTL: DefaultLeaseTTL, LookupTimeout: DefaultLookupTimeout,
		FetchTimeout: DefaultFetchTimeout, HandshakeTimeout: DefaultHandshakeTimeout,
		RetryMin: DefaultRetryMin, RetryMax: DefaultRetryMax, HeartbeatInterval: DefaultHeartbeatInterval,
		Clock: supervision.RealClock{}, JobSeq: &atomic.Uint64{}})
	defaults.FillNonPositive(&c, Config{MaxMalformed: DefaultMaxMalformed, MaxSessions: DefaultMaxSessions, SendQueue: DefaultSendQueue})
	return c
}

// Validate reports a config the plane cannot run with.
func (c Config) Validate() error {
	switch {
	case c.Node == "" || len(c.Node) > 128:
		return fmt.Errorf("%w: peer node id %q: want 1..128 bytes", messages.ErrBadConfig, c.Node)
	case len(c.Secret) < 16:
		return fmt.Errorf("%w: peer secret: want at least 16 bytes", messages.ErrBadConfig)
	case c.Transport == nil:
		return fmt.Errorf("%w: peer transport missing", messages.ErrBadConfig)
	case c.BlockBytes <= 0 || c.Slots <= 0:
		return fmt.Errorf("%w: peer pool geometry %d×%d", messages.ErrBadConfig, c.Slots, c.BlockBytes)
	}
	seen := map[string]bool{c.Node: true}
	for _, p := range c.Peers {
		if p.Node == "" || p.Addr == "" {
			return fmt.Errorf("%w: peer %q at %q: node id and address required", messages.ErrBadConfig, p.Node, p.Addr)
		}
		if seen[p.Node] {
			return fmt.Errorf("%w: peer %q listed twice (or is this node)", messages.ErrBadConfig, p.Node)
		}
		seen[p.Node] = true
	}
	return nil
}

// blockLen is the length of a block of namespace ns held in slot of our
// pool: its namespace's (BlockSizes), else its slot's bytes.
func (c *Config) blockLen(ns string, slot int) int {
	if n, ok := c.BlockSizes[ns]; ok && n > 0 {
		return n
	}
	return c.slotBytes(slot)
}

// slotBytes is the bytes of slot of our pool (0: no such slot); without a
// Region, or without the slot (-1: an answer that named none), a slot of
// the grid.
func (c *Config) slotBytes(slot int) int {
	if c.Region.Slots == 0 || slot < 0 {
		return c.BlockBytes
	}
	return c.Region.SlotSize(slot)
}

// maxBlock is the longest block a slot of ours takes now.
func (c *Config) maxBlock() func() int {
	switch {
	case c.LargestSlot != nil:
		return c.LargestSlot
	case c.Region.Slots == 0:
		return func() int { return c.BlockBytes }
	}
	return c.Region.MaxSlot
}

// allowed reports whether node may open a session with us.
func (c *Config) allowed(node string) bool {
	if len(c.Allow) == 0 {
		return true
	}
	for _, a := range c.Allow {
		if a == node {
			return true
		}
	}
	for _, p := range c.Peers {
		if p.Node == node {
			return true
		}
	}
	return false
}

// staticEvents reports whether the static peer node has its event
// addresses configured.
func (c Config) staticEvents(node string) bool {
	for _, a := range c.Peers {
		if a.Node == node {
			return a.Events != ""
		}
	}
	return false
}
