package main

// The command line, and the config it builds: flags override the file.

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/messages"
)

// options are the parsed command line.
type options struct {
	configPath      string
	poolPath        string
	poolBytes       kvtier.ByteSize
	blockBytes      kvtier.ByteSize
	policy          string
	metricsListen   string
	logLevel        string
	logFormat       string
	shutdownTimeout time.Duration
	engineListen    string
	engineGrace     time.Duration
	enginePoll      time.Duration
	engineGroup     string
	eventsEndpoint  string
	eventsReplay    string
	eventsLearn     string
	eventsTopic     string
	nodeID          string
	peerListen      string
	peerDataListen  string
	peerSecretFile  string
	peerTransport   string
	peers           peerFlags
	printTopology   bool
	// set holds the names of the flags given on the command line.
	set map[string]bool
}

// parseFlags parses args; errors have already been printed with the usage.
func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("kvtierd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.configPath, "config", "", "YAML config `file` (flags override it)")
	fs.StringVar(&o.poolPath, "pool-path", defaultPoolPath(), "shared-memory pool `file`; empty: anonymous memfd")
	fs.Var(&o.poolBytes, "pool-bytes", "pool capacity, e.g. 1GiB (default from config, else 1GiB)")
	fs.Var(&o.blockBytes, "block-bytes", "block (slot) size, e.g. 256KiB (default from config, else 256KiB)")
	fs.StringVar(&o.policy, "policy", "", "eviction policy: lru, arc or prefix (default from config, else lru)")
	fs.StringVar(&o.metricsListen, "metrics-listen", "127.0.0.1:9464", "HTTP `address` for /metrics, /healthz, /readyz")
	fs.StringVar(&o.logLevel, "log-level", "info", "log `level`: trace, debug, info, warn, error")
	fs.StringVar(&o.logFormat, "log-format", "auto", "log format: auto (console on a terminal, else json), console, json")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "bound on graceful shutdown")
	fs.StringVar(&o.engineListen, "engine-listen", "", "engine endpoint `address`: ipc:///path, unix:///path (length-prefixed frames, no ZeroMQ) or tcp://127.0.0.1:PORT (default from config, else none)")
	fs.DurationVar(&o.engineGrace, "engine-grace", 0, "release an engine connection silent this long (default from config, else 10s)")
	fs.DurationVar(&o.enginePoll, "engine-poll", 0, "poll a unix:// engine connection this long after its last call before waiting for the next, e.g. 100us (default from config, else 0: off)")
	fs.StringVar(&o.engineGroup, "engine-group", "", "`group` allowed to use the engine socket and the pool file (mode 0660)")
	fs.StringVar(&o.eventsEndpoint, "events-endpoint", "", "KV events PUB `address` to bind, e.g. tcp://*:5557 (default from config, else off)")
	fs.StringVar(&o.eventsReplay, "events-replay", "", "KV events replay ROUTER `address` to bind, e.g. tcp://*:5558 (default from config, else off)")
	fs.StringVar(&o.eventsLearn, "events-learn-from", "", "engines' own KV event publishers to learn token ids from, comma-separated `addresses` (vLLM's kv_events_config endpoint, e.g. tcp://127.0.0.1:5557; default from config, else none)")
	fs.StringVar(&o.eventsTopic, "events-topic", "", "KV events topic (default from config, else kv@<node_id>@<model>)")
	fs.StringVar(&o.nodeID, "node-id", "", "this node's id among its peers (default from config)")
	fs.StringVar(&o.peerListen, "peer-listen", "", "peer control-plane `address` to bind, e.g. tcp://0.0.0.0:7600 (default from config, else peers off)")
	fs.StringVar(&o.peerDataListen, "peer-data-listen", "", "tcp data-plane `address` to bind, e.g. 0.0.0.0:7601 (default: the peer-listen host, any port)")
	fs.StringVar(&o.peerSecretFile, "peer-secret-file", "", "`file` holding the peers' shared HMAC secret (default from config)")
	fs.StringVar(&o.peerTransport, "peer-transport", "", "data plane: tcp or nixl (default from config, else tcp)")
	fs.BoolVar(&o.printTopology, "print-topology", false, "print the actors this configuration runs (spawn order, who sends to whom) and exit")
	fs.Var(&o.peers, "peer", "a peer to dial, `node-id=tcp://host:port` (repeatable; adds to the config's)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
		fmt.Fprintln(stderr, "kvtierd:", err)
		return o, err
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	return o, nil
}

func defaultPoolPath() string { return fmt.Sprintf("/dev/shm/kvtier-%d.pool", os.Getpid()) }

// buildConfig loads the config file, if any, and overlays the flags given.
func buildConfig(o options) (kvtier.Config, error) {
	var cfg kvtier.Config
	if o.configPath != "" {
		var err error
		if cfg, err = kvtier.LoadConfigFile(o.configPath); err != nil {
			return cfg, err
		}
	}
	// A file cannot tell an absent pool_path from an empty one, so only an
	// explicit --pool-path= selects the memfd.
	if o.set["pool-path"] || cfg.PoolPath == "" {
		cfg.PoolPath = o.poolPath
	}
	// Zero means "default" in Config; on the command line it is a mistake.
	if o.set["pool-bytes"] {
		if o.poolBytes <= 0 {
			return cfg, fmt.Errorf("%w: pool_bytes (--pool-bytes) %d must be positive", messages.ErrBadConfig, int64(o.poolBytes))
		}
		cfg.PoolBytes = int64(o.poolBytes)
	}
	if o.set["block-bytes"] {
		if o.blockBytes <= 0 || int64(o.blockBytes) != int64(int(o.blockBytes)) {
			return cfg, fmt.Errorf("%w: block_bytes (--block-bytes) %d must be positive and fit an int", messages.ErrBadConfig, int64(o.blockBytes))
		}
		cfg.BlockBytes = int(o.blockBytes)
	}
	overlay(o.set, "policy", &cfg.Policy, o.policy)
	overlay(o.set, "engine-listen", &cfg.EngineListen, o.engineListen)
	if o.set["engine-grace"] && o.engineGrace <= 0 {
		return cfg, fmt.Errorf("%w: engine_grace (--engine-grace) %v must be positive", messages.ErrBadConfig, o.engineGrace)
	}
	overlay(o.set, "engine-grace", &cfg.EngineGrace, o.engineGrace)
	overlay(o.set, "engine-poll", &cfg.EnginePoll, o.enginePoll)
	overlay(o.set, "engine-group", &cfg.EngineGroup, o.engineGroup)
	overlayEvents(&cfg.Events, o)
	overlayPeers(&cfg.Peers, o)
	if err := cfg.WithDefaults().Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// overlay sets *field to v when the flag name was given: a flag left out
// keeps the file's value (or the default).
func overlay[T any](given map[string]bool, name string, field *T, v T) {
	if given[name] {
		*field = v
	}
}

// overlayEvents applies the KV events flags given.
func overlayEvents(e *kvtier.EventsConfig, o options) {
	overlay(o.set, "events-endpoint", &e.Endpoint, o.eventsEndpoint)
	overlay(o.set, "events-replay", &e.Replay, o.eventsReplay)
	overlay(o.set, "events-topic", &e.Topic, o.eventsTopic)
	if o.set["events-learn-from"] {
		e.LearnFrom = splitList(o.eventsLearn)
	}
}

// overlayPeers applies the peer flags given.
func overlayPeers(p *kvtier.PeersConfig, o options) {
	overlay(o.set, "node-id", &p.NodeID, o.nodeID)
	overlay(o.set, "peer-listen", &p.Listen, o.peerListen)
	overlay(o.set, "peer-data-listen", &p.DataListen, o.peerDataListen)
	if o.set["peer-secret-file"] {
		// The file replaces any secret the config file gave inline.
		p.SecretFile, p.Secret = o.peerSecretFile, ""
	}
	overlay(o.set, "peer-transport", &p.Transport, o.peerTransport)
	p.Static = append(p.Static, o.peers...)
}

// peerFlags collects repeated --peer node-id=address flags.
type peerFlags []kvtier.PeerAddr

func (f *peerFlags) String() string { return fmt.Sprint(*f) }

func (f *peerFlags) Set(v string) error {
	id, addr, ok := strings.Cut(v, "=")
	if !ok || id == "" || addr == "" {
		return fmt.Errorf("want node-id=tcp://host:port, got %q", v)
	}
	*f = append(*f, kvtier.PeerAddr{NodeID: id, Addr: addr})
	return nil
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
