package main

// The command line, and the config it builds: flags override the
// environment, which overrides the file.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/config"
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
	version         bool
	// set holds the names of the flags given on the command line.
	set map[string]bool
	// environ is the environment read for KVTIER_<KEY> (config.FromEnv):
	// os.Environ in the daemon, nil unless a test sets it.
	environ []string
}

// engineOff is the engine_listen value (flag, environment or file) that
// turns the engine endpoint off; so does an explicit --engine-listen=.
const engineOff = "none"

// parseFlags parses args; errors have already been printed, --help's
// usage too (the error is then pflag.ErrHelp).
func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := pflag.NewFlagSet("kvtierd", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.SortFlags = false
	fs.Usage = func() { printUsage(stderr, fs) }
	fs.StringVar(&o.configPath, "config", "", "YAML config `file` (the environment and flags override it)")
	fs.StringVar(&o.poolPath, "pool-path", defaultPoolPath(), "shared-memory pool `file`; empty: anonymous memfd")
	fs.Var(sizeValue{&o.poolBytes}, "pool-bytes", "pool capacity, e.g. 1GiB (default from config, else 1GiB)")
	fs.Var(sizeValue{&o.blockBytes}, "block-bytes", "block (slot) size, e.g. 256KiB (default from config, else 256KiB)")
	fs.StringVar(&o.policy, "policy", "", "eviction policy: lru, arc or prefix (default from config, else lru)")
	fs.StringVar(&o.metricsListen, "metrics-listen", "127.0.0.1:9464", "HTTP `address` for /metrics, /healthz, /readyz")
	fs.StringVar(&o.logLevel, "log-level", "info", "log `level`: trace, debug, info, warn, error")
	fs.StringVar(&o.logFormat, "log-format", "auto", "log format: auto (console on a terminal, else json), console, json")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "bound on graceful shutdown")
	fs.StringVar(&o.engineListen, "engine-listen", "", "engine endpoint `address`: unix:///path (length-prefixed frames, no ZeroMQ), ipc:///path or tcp://127.0.0.1:PORT; none (or empty): no endpoint (default from config, else $KVTIER_ADDRESS, else "+config.DefaultEngineAddress()+" for this user)")
	fs.DurationVar(&o.engineGrace, "engine-grace", 0, "release an engine connection silent this long (default from config, else 10s)")
	fs.DurationVar(&o.enginePoll, "engine-poll", 0, "poll a unix:// engine connection this long after its last call before waiting for the next, e.g. 100us (default from config, else 0: off)")
	fs.StringVar(&o.engineGroup, "engine-group", "", "`group` allowed to use the engine socket and the pool file (mode 0660)")
	fs.StringVar(&o.eventsEndpoint, "events-endpoint", "", "KV events PUB `address`: bound, e.g. tcp://*:5557, or connected to a router that binds with events.mode connect/auto (KVTIER_EVENTS_MODE; default from config, else off)")
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
	fs.BoolVar(&o.version, "version", false, "print kvtierd's version and exit")
	if err := fs.Parse(args); err != nil {
		if !errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintln(stderr, "kvtierd:", err)
			if hint := singleDashHint(fs, args); hint != "" {
				fmt.Fprintln(stderr, "kvtierd:", hint)
			}
			fmt.Fprintln(stderr, "kvtierd: the flags: kvtierd --help")
		}
		return o, err
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
		fmt.Fprintln(stderr, "kvtierd:", err)
		return o, err
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *pflag.Flag) { o.set[f.Name] = true })
	return o, nil
}

// printUsage is --help: the flags, then what else configures the daemon.
func printUsage(w io.Writer, fs *pflag.FlagSet) {
	fmt.Fprintf(w, "Usage: kvtierd [flags]\n\nRuns a kvtier node as a daemon (docs/OPERATIONS.md).\n\nFlags:\n%s", fs.FlagUsages())
	fmt.Fprint(w, `
Environment: every config file key may be set as KVTIER_<KEY>, the key
upper-cased, a section's keys joined with _ (KVTIER_POOL_BYTES=16GiB,
KVTIER_EVENTS_ENDPOINT=tcp://*:5557, KVTIER_PEERS_LISTEN=tcp://0.0.0.0:7600);
lists comma-separated. Flags override the environment, which overrides
--config, which overrides the defaults. An unknown KVTIER_ variable that looks
like a key is an error. KVTIER_ADDRESS sets the default engine address.
`)
}

// singleDashHint explains a parse error caused by a long flag given one
// dash (pflag reads -pool-bytes as the shorthands -p -o -o ...).
func singleDashHint(fs *pflag.FlagSet, args []string) string {
	for _, a := range args {
		if a == "--" {
			break
		}
		name, ok := strings.CutPrefix(a, "-")
		if !ok || strings.HasPrefix(name, "-") || len(name) < 2 {
			continue
		}
		name, _, _ = strings.Cut(name, "=")
		if fs.Lookup(name) != nil {
			return fmt.Sprintf("long flags take two dashes: --%s, not %s", strings.TrimPrefix(a, "-"), a)
		}
	}
	return ""
}

// sizeValue is a kvtier.ByteSize as a pflag.Value.
type sizeValue struct{ p *kvtier.ByteSize }

func (v sizeValue) Set(s string) error { return v.p.Set(s) }
func (v sizeValue) String() string {
	if v.p == nil {
		return "0"
	}
	return v.p.String()
}
func (sizeValue) Type() string { return "size" }

func defaultPoolPath() string { return fmt.Sprintf("/dev/shm/kvtier-%d.pool", os.Getpid()) }

// buildConfig layers the sources of the node's config, each overriding the
// one before: the defaults (left to Open), the config file, the
// environment's KVTIER_<KEY> variables (config.FromEnv), the flags given.
// Then it picks the pool file and the engine address left unset
// (resolveEngineListen) and validates the result once.
func buildConfig(o options) (kvtier.Config, error) {
	var cfg kvtier.Config
	if o.configPath != "" {
		// NB: parsed, not loaded: validation waits for the other sources,
		// which may override what the file alone gets wrong.
		data, err := os.ReadFile(o.configPath)
		if err != nil {
			return cfg, fmt.Errorf("kvtier: reading config file: %w", err)
		}
		if cfg, err = kvtier.ParseConfig(data); err != nil {
			return cfg, fmt.Errorf("%s: %w", o.configPath, err)
		}
	}
	if err := config.FromEnv(o.environ, &cfg); err != nil {
		return cfg, err
	}
	// Neither a file nor the environment can tell an absent pool_path from
	// an empty one, so only an explicit --pool-path= selects the memfd.
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
	resolveEngineListen(&cfg, o.set["engine-listen"])
	if err := cfg.WithDefaults().Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// resolveEngineListen settles where the daemon serves engines: "none" (from
// any source) or an explicit --engine-listen= is no endpoint; an address
// from no source is config.DefaultEngineAddress, unless the pool is an
// anonymous memfd, which no engine could map.
func resolveEngineListen(cfg *kvtier.Config, flagGiven bool) {
	switch {
	case cfg.EngineListen == engineOff:
		cfg.EngineListen = ""
	case cfg.EngineListen == "" && !flagGiven && cfg.PoolPath != "":
		cfg.EngineListen = config.DefaultEngineAddress()
	}
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

func (f *peerFlags) String() string {
	if len(*f) == 0 {
		return "" // NB: pflag prints no default for ""
	}
	return fmt.Sprint(*f)
}

// Type names the value in --help (pflag.Value).
func (f *peerFlags) Type() string { return "peer" }

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
