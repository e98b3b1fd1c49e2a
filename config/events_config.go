package config

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/internal/defaults"
)

// EventsConfig turns on KV events in vLLM's wire format (docs/PROTOCOL.md,
// "KV events"). Off unless Endpoint is set.
type EventsConfig struct {
	// Endpoint is the node's PUB address, e.g. "tcp://*:5557" or
	// "ipc:///run/kvtier/events" to bind, "tcp://epp:5557" to connect to
	// (Mode). Empty: no events.
	Endpoint string `yaml:"endpoint"`
	// Mode is how the PUB opens Endpoint:
	//   - "bind" (the default): routers connect to the node;
	//   - "connect": the node connects to a router that bound a SUB (llm-d's
	//     EPP binds one, e.g. tcp://<epp-service>:5557, and every engine
	//     connects to it), and connects again whenever the connection ends;
	//   - "auto": vLLM's rule for its own kv_events_config endpoint
	//     (vllm/distributed/kv_events.py, ZmqEventPublisher.
	//     _is_bind_endpoint): bind an address with "*" or "::" and every
	//     ipc:// address, connect to the rest; the endpoint is then written
	//     as it is for vLLM.
	Mode string `yaml:"mode"`
	// Replay is the ROUTER address the node binds for replay requests
	// (whatever Mode says: replay clients connect to ask). Empty: no
	// replay socket. Needs Endpoint.
	Replay string `yaml:"replay"`
	// Topic is the first frame of every message; default kv@<node_id>@<model>.
	Topic string `yaml:"topic"`
	// NodeID names this node in the default topic; default the host name.
	NodeID string `yaml:"node_id"`
	// Model names the served model in the default topic; default "kvtier".
	Model string `yaml:"model"`
	// HashFormat is "int" (default, vLLM's: the low 64 bits as an unsigned
	// int) or "bytes" (the raw hash).
	HashFormat string `yaml:"hash_format"`
	// SpecKind is the kv_cache_spec_kind (vLLM 0.33) of stored blocks whose
	// request does not say, e.g. "full_attention"; default: omitted.
	SpecKind string `yaml:"kv_cache_spec_kind"`
	// BufferBatches bounds the replay buffer (default 10,000 batches; it is
	// also bounded to 256 MiB of payload).
	BufferBatches int `yaml:"buffer_batches"`
	// DataParallelRank is the third element of every batch (default 0).
	DataParallelRank int `yaml:"data_parallel_rank"`
	// Encoding is "map" (default: each event a map tagged by "type", as
	// vLLM writes them since PR #42892) or "array" (vLLM's legacy positional
	// arrays, for routers that read only those; newer fields left out).
	Encoding string `yaml:"encoding"`
	// BatchWindow is how long the hub gathers events into one batch after
	// the first (default 10ms; negative: only what its mailbox holds at
	// once). vLLM publishes one batch per engine step; one per event would
	// cost a message each and fill the replay buffer ten times sooner.
	BatchWindow time.Duration `yaml:"batch_window"`
	// Linger bounds how long Close waits after the last send for ZeroMQ to
	// hand queued batches to subscribers (default 100ms; negative: none).
	Linger time.Duration `yaml:"linger"`
	// LearnFrom lists engines' own KV event publishers (vLLM's
	// kv_events_config endpoint, e.g. "tcp://127.0.0.1:5557"), or addresses
	// the node binds for engines that connect (LearnMode): the node
	// subscribes to them and announces the blocks those engines store in
	// kvtier with the token ids the engines announced (docs/VLLM.md,
	// "Events"). Needs Endpoint.
	LearnFrom []string `yaml:"learn_from"`
	// LearnMode is how each LearnFrom SUB opens its address:
	//   - "auto" (the default): the other end of vLLM's rule (see Mode):
	//     bind a tcp address whose host is "*" or "::" (vLLM's endpoint
	//     then names this node, e.g. tcp://<kvtierd>:5558, and vLLM
	//     connects), connect to any other (where vLLM bound: its tcp://*
	//     or ipc:// endpoint);
	//   - "connect": always connect;
	//   - "bind": always bind (e.g. an ipc:// path vLLM is told to connect
	//     to — vLLM itself binds every ipc:// address, so this is for
	//     other publishers).
	// A bound SUB hears every engine that connects to it.
	LearnMode string `yaml:"learn_mode"`
	// LearnCapacity bounds the blocks remembered from LearnFrom (default
	// events.DefaultLearnCapacity).
	LearnCapacity int `yaml:"learn_capacity"`
	// LearnWait bounds how long a stored block waits for its engine's
	// announcement (default events.DefaultLearnWait).
	LearnWait time.Duration `yaml:"learn_wait"`
}

// Enabled reports whether events are published.
func (c EventsConfig) Enabled() bool { return c.Endpoint != "" }

func (c EventsConfig) withDefaults() EventsConfig {
	if !c.Enabled() {
		return c
	}
	if c.NodeID == "" {
		c.NodeID, _ = os.Hostname()
		if c.NodeID == "" {
			c.NodeID = "kvtier"
		}
	}
	defaults.Fill(&c, EventsConfig{
		Model:         "kvtier",
		HashFormat:    "int",
		Mode:          events.ModeBind,
		LearnMode:     events.ModeAuto,
		BufferBatches: events.DefaultBufferBatches,
		Linger:        events.DefaultLinger,
		BatchWindow:   events.DefaultBatchWindow,
		LearnCapacity: events.DefaultLearnCapacity,
		LearnWait:     events.DefaultLearnWait,
	})
	if c.Topic == "" {
		c.Topic = "kv@" + c.NodeID + "@" + c.Model
	}
	return c
}

func (c EventsConfig) validate() error {
	bad := func(format string, a ...any) error { return badConfig("events: "+format, a...) }
	switch {
	case c.Replay != "" && c.Endpoint == "":
		return bad("replay %q needs an endpoint", c.Replay)
	case c.Endpoint != "" && !validZMQAddr(c.Endpoint):
		return bad("endpoint %q (want tcp://HOST:PORT or ipc://PATH)", c.Endpoint)
	case c.Replay != "" && !validZMQAddr(c.Replay):
		return bad("replay %q (want tcp://HOST:PORT or ipc://PATH)", c.Replay)
	case c.BufferBatches < 0:
		return bad("buffer_batches %d must be positive", c.BufferBatches)
	case c.DataParallelRank < 0:
		return bad("data_parallel_rank %d must not be negative", c.DataParallelRank)
	case len(c.LearnFrom) > 0 && c.Endpoint == "":
		return bad("learn_from needs an endpoint (the node publishes what it learns)")
	case c.LearnCapacity < 0:
		return bad("learn_capacity %d must not be negative", c.LearnCapacity)
	}
	if c.Endpoint != "" {
		if _, err := events.PublisherBinds(c.Mode, c.Endpoint); err != nil {
			return fmt.Errorf("events: mode: %w", err)
		}
	}
	for _, a := range c.LearnFrom {
		if !validZMQAddr(a) {
			return bad("learn_from %q (want tcp://HOST:PORT or ipc://PATH)", a)
		}
		if _, err := events.SubscriberBinds(c.LearnMode, a); err != nil {
			return fmt.Errorf("events: learn_mode: %w", err)
		}
	}
	if _, err := events.ParseHashFormat(c.HashFormat); err != nil {
		return fmt.Errorf("events: %w", err)
	}
	if _, err := events.ParseEncoding(c.Encoding); err != nil {
		return fmt.Errorf("events: %w", err)
	}
	return nil
}

func validZMQAddr(a string) bool {
	return strings.HasPrefix(a, "tcp://") && len(a) > len("tcp://") ||
		strings.HasPrefix(a, "ipc://") && len(a) > len("ipc://")
}
