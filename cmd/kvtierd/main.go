// Command kvtierd runs a kvtier node as a standalone daemon: it opens the
// node (kvtier.Open) with a config from a YAML file and flags, serves the
// node's Prometheus metrics and health probes over HTTP, and shuts the node
// down gracefully on SIGINT or SIGTERM. Everything else lives in the library.
//
// Usage:
//
//	kvtierd [--config FILE] [--pool-path PATH] [--pool-bytes SIZE]
//	        [--block-bytes SIZE] [--policy lru|arc]
//	        [--metrics-listen ADDR] [--log-level LEVEL]
//	        [--log-format auto|console|json] [--shutdown-timeout DUR]
//	        [--engine-listen ADDR] [--engine-grace DUR] [--engine-poll DUR] [--engine-group GROUP]
//	        [--events-endpoint ADDR] [--events-replay ADDR] [--events-topic TOPIC]
//
// Flags given on the command line override the config file. Sizes take
// integers or human strings ("16MiB", "64KiB"). The pool lives in the
// shared-memory file --pool-path, by default /dev/shm/kvtier-<pid>.pool so
// that an out-of-process engine can map it; an explicitly empty
// --pool-path= selects an anonymous memfd instead. The node removes the
// file when it closes.
//
// HTTP endpoints on --metrics-listen (a port of 0 picks a free one; the
// bound address is logged as metrics_addr):
//
//	/metrics  Prometheus metrics from the node's private registry
//	/healthz  200 while the process runs
//	/readyz   200 once the node is open, 503 before and once shutdown began
//
// Standalone mode: --engine-listen ipc:///path (or tcp://127.0.0.1:PORT)
// serves the manager API to out-of-process engines (docs/PROTOCOL.md); the
// socket and the pool file are mode 0600, or 0660 in --engine-group. An
// engine silent for --engine-grace is released (leases, pins, pending
// writes, jobs). The bound address is logged as engine_listen.
//
// KV events (docs/PROTOCOL.md, "KV events"): --events-endpoint tcp://*:5557
// binds a ZeroMQ PUB socket publishing vLLM-format KV events, and
// --events-replay tcp://*:5558 a ROUTER socket serving replays; both off
// unless given (or set under events: in the config file). The bound
// addresses are logged as events_endpoint and events_replay.
// --events-learn-from tcp://127.0.0.1:5557 subscribes to a vLLM engine's own
// KV events, so the blocks it stores in kvtier are announced with their
// token ids (docs/VLLM.md, "KV events").
//
// KVTIERD_CPUPROFILE=FILE (environment): a Go CPU profile of the whole run,
// written to FILE at shutdown (`go tool pprof kvtierd FILE`).
//
// Exit status: 0 after a clean shutdown, 2 for bad flags, a bad config or a
// failed Open, 1 for any other failure (HTTP listener, unclean shutdown). A
// second signal during shutdown kills the process at once.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/internal/gcpercent"
	"github.com/kvtier/kvtier/messages"
)

// Exit statuses.
const (
	exitOK     = 0
	exitFailed = 1
	exitConfig = 2
)

// startCPUProfile profiles the process into path until the returned func
// runs (KVTIERD_CPUPROFILE; docs/PERFORMANCE.md).
// printTopology writes the actors a node opened with cfg runs (--print-topology).
func printTopology(w io.Writer, cfg kvtier.Config) int {
	top, err := kvtier.PlanTopology(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvtierd:", err)
		return exitConfig
	}
	fmt.Fprint(w, top)
	return exitOK
}

func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

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

// newLogger builds the daemon's logger on w.
func newLogger(w *os.File, level, format string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Logger{}, fmt.Errorf("bad --log-level %q", level)
	}
	var out io.Writer = w
	switch format {
	case "json":
	case "console":
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339Nano}
	case "auto":
		if isatty.IsTerminal(w.Fd()) {
			out = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339Nano}
		}
	default:
		return zerolog.Logger{}, fmt.Errorf("bad --log-format %q (want auto, console or json)", format)
	}
	return zerolog.New(out).Level(lvl).With().Timestamp().Logger(), nil
}

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
	if o.set["policy"] {
		cfg.Policy = o.policy
	}
	if o.set["engine-listen"] {
		cfg.EngineListen = o.engineListen
	}
	if o.set["engine-grace"] {
		if o.engineGrace <= 0 {
			return cfg, fmt.Errorf("%w: engine_grace (--engine-grace) %v must be positive", messages.ErrBadConfig, o.engineGrace)
		}
		cfg.EngineGrace = o.engineGrace
	}
	if o.set["engine-poll"] {
		cfg.EnginePoll = o.enginePoll
	}
	if o.set["engine-group"] {
		cfg.EngineGroup = o.engineGroup
	}
	if o.set["events-endpoint"] {
		cfg.Events.Endpoint = o.eventsEndpoint
	}
	if o.set["events-replay"] {
		cfg.Events.Replay = o.eventsReplay
	}
	if o.set["events-topic"] {
		cfg.Events.Topic = o.eventsTopic
	}
	if o.set["events-learn-from"] {
		cfg.Events.LearnFrom = splitList(o.eventsLearn)
	}
	overlayPeers(&cfg.Peers, o)
	if err := cfg.WithDefaults().Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// overlayPeers applies the peer flags given.
func overlayPeers(p *kvtier.PeersConfig, o options) {
	if o.set["node-id"] {
		p.NodeID = o.nodeID
	}
	if o.set["peer-listen"] {
		p.Listen = o.peerListen
	}
	if o.set["peer-data-listen"] {
		p.DataListen = o.peerDataListen
	}
	if o.set["peer-secret-file"] {
		p.SecretFile, p.Secret = o.peerSecretFile, ""
	}
	if o.set["peer-transport"] {
		p.Transport = o.peerTransport
	}
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

// run is the daemon; it returns the exit status.
func run(args []string, stderr *os.File) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitConfig
	}
	base, err := newLogger(stderr, o.logLevel, o.logFormat)
	if err != nil {
		fmt.Fprintln(stderr, "kvtierd:", err)
		return exitConfig
	}
	log := base.With().Str("component", "kvtierd").Logger()
	cfg, err := buildConfig(o)
	if err != nil {
		ev := log.Error().Err(err)
		if o.configPath != "" {
			ev = ev.Str("config", o.configPath)
		}
		ev.Msg("bad configuration")
		return exitConfig
	}
	if o.printTopology {
		return printTopology(os.Stdout, cfg)
	}
	cfg.Logger = &base // the node adds its own component fields
	log.Debug().Int("gc_percent", gcpercent.Apply(gcpercent.Default)).Msg("garbage collector target")

	if path := os.Getenv("KVTIERD_CPUPROFILE"); path != "" {
		// For profiling the daemon under a benchmark: written at shutdown.
		if stopProfile, err := startCPUProfile(path); err != nil {
			log.Warn().Err(err).Msg("no CPU profile")
		} else {
			defer stopProfile()
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// Listen before Open so probes answer (not ready) while the node opens.
	ln, err := net.Listen("tcp", o.metricsListen)
	if err != nil {
		log.Error().Err(err).Str("metrics_listen", o.metricsListen).Msg("cannot listen for metrics")
		return exitFailed
	}
	if cfg.Peers.Discovery.Enabled() && cfg.Peers.Discovery.Metrics == "" {
		// NB: registered for `kvtier fleet status`; a wildcard bind takes
		// the advertised control host, as the other registered addresses do.
		cfg.Peers.Discovery.Metrics = metricsURL(ln.Addr().String(), cfg.Peers.Discovery.Advertise)
	}
	var ready atomic.Bool
	var metrics atomic.Pointer[http.Handler]
	srv := &http.Server{Handler: probes(&ready, &metrics), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	node, err := kvtier.Open(ctx, cfg)
	if err != nil {
		log.Error().Err(err).Msg("cannot open node")
		_ = srv.Close()
		<-served
		return exitConfig
	}
	h := promhttp.HandlerFor(node.Registry(), promhttp.HandlerOpts{ErrorLog: promLogger{log}})
	metrics.Store(&h)
	ready.Store(true)
	c := cfg.WithDefaults()
	log.Info().
		Str("metrics_addr", ln.Addr().String()).
		Str("pool_path", c.PoolPath).
		Int64("pool_bytes", c.PoolBytes).
		Int("block_bytes", c.BlockBytes).
		Int64("slots", c.PoolBytes/int64(c.BlockBytes)).
		Str("policy", c.Policy).
		Str("engine_listen", node.EngineAddr()).
		Str("events_endpoint", node.EventsEndpoint()).
		Str("events_replay", node.EventsReplayEndpoint()).
		Str("peer_listen", node.PeerAddr()).
		Msg("kvtierd listening")

	status := exitOK
	serveErr := error(nil)
	select {
	case <-ctx.Done():
		log.Info().Msg("signal received, shutting down")
	case serveErr = <-served:
		log.Error().Err(serveErr).Msg("metrics server failed, shutting down")
		status = exitFailed
	}
	stop() // from here a second signal kills the process
	ready.Store(false)
	if err := shutdown(log, node, srv, served, serveErr == nil, o.shutdownTimeout); err != nil {
		status = exitFailed
	}
	log.Info().Int("exit_status", status).Msg("kvtierd stopped")
	return status
}

// shutdown closes the node, then the HTTP server, within timeout. Probes
// keep answering (readyz 503) while the node drains. serving says whether
// the server goroutine has yet to report on served.
func shutdown(log zerolog.Logger, node *kvtier.Node, srv *http.Server, served <-chan error, serving bool, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	var failed error
	if err := node.Close(ctx); err != nil {
		log.Error().Err(err).Msg("node did not close cleanly")
		failed = fmt.Errorf("closing node: %w", err)
	}
	if err := srv.Shutdown(ctx); err != nil {
		log.Warn().Err(err).Msg("metrics server shutdown cut short")
		_ = srv.Close()
	}
	if serving {
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("metrics server failed")
			failed = errors.Join(failed, fmt.Errorf("serving metrics: %w", err))
		}
	}
	log.Info().Float64("shutdown_seconds", time.Since(start).Seconds()).Msg("node closed")
	return failed
}

// metricsURL is the /metrics URL of the listener bound at addr; a wildcard
// address takes advertise's host (tcp://host:port) when there is one.
func metricsURL(addr, advertise string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if h, _, err := net.SplitHostPort(strings.TrimPrefix(advertise, "tcp://")); err == nil {
			host = h
		}
	}
	return "http://" + net.JoinHostPort(host, port) + "/metrics"
}

// probes routes /healthz, /readyz and /metrics.
func probes(ready *atomic.Bool, metrics *atomic.Pointer[http.Handler]) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		h := metrics.Load()
		if h == nil {
			http.Error(w, "node not open", http.StatusServiceUnavailable)
			return
		}
		(*h).ServeHTTP(w, r)
	})
	return mux
}

// promLogger sends promhttp's errors to the structured log.
type promLogger struct{ log zerolog.Logger }

// Println implements promhttp.Logger.
func (l promLogger) Println(v ...any) {
	l.log.Error().Msg(strings.TrimSpace(fmt.Sprintln(v...)))
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
