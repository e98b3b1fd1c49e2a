// Command kvtierd runs a kvtier node as a standalone daemon: it opens the
// node (kvtier.Open) with a config from a YAML file, the environment and
// flags, serves the node's Prometheus metrics and health probes over HTTP,
// and shuts the node down gracefully on SIGINT or SIGTERM. Everything else
// lives in the library.
//
// Usage:
//
//	kvtierd [--config FILE] [--pool-path PATH] [--pool-bytes SIZE]
//	        [--block-bytes SIZE] [--policy lru|arc|prefix]
//	        [--metrics-listen ADDR] [--log-level LEVEL]
//	        [--log-format auto|console|json] [--shutdown-timeout DUR]
//	        [--engine-listen ADDR|none] [--engine-grace DUR] [--engine-poll DUR] [--engine-group GROUP]
//	        [--events-endpoint ADDR] [--events-replay ADDR] [--events-learn-from ADDRS] [--events-topic TOPIC]
//	        [--node-id ID] [--peer-listen ADDR] [--peer-data-listen ADDR] [--peer-secret-file FILE]
//	        [--peer-transport tcp|nixl] [--peer NODE-ID=ADDR]... [--print-topology]
//	kvtierd --version
//	kvtierd --help
//
// Flags are long and take two dashes (--pool-bytes 16MiB or
// --pool-bytes=16MiB); --version prints "kvtierd" and the build
// (internal/version) and exits 0.
//
// Every key of the config file may also be set in the environment as
// KVTIER_<KEY>: the key upper-cased, a section's keys joined with "_"
// (KVTIER_POOL_BYTES=16GiB, KVTIER_EVENTS_ENDPOINT=tcp://*:5557,
// KVTIER_PEERS_LISTEN=tcp://0.0.0.0:7600; lists comma-separated; an empty
// variable is unset); config.FromEnv has the rules, and refuses an unknown
// KVTIER_ variable that looks like a mistyped key. The sources override
// one another in this order: flags given, then the environment, then the
// config file, then the defaults. Sizes take integers or human strings
// ("16MiB", "64KiB"). The pool lives in the shared-memory file
// --pool-path, by default /dev/shm/kvtier-<pid>.pool so that an
// out-of-process engine can map it; an explicitly empty --pool-path=
// selects an anonymous memfd instead. The node removes the file when it
// closes.
//
// HTTP endpoints on --metrics-listen (a port of 0 picks a free one; the
// bound address is logged as metrics_addr):
//
//	/metrics  Prometheus metrics from the node's private registry
//	/healthz  200 while the process runs
//	/readyz   200 once the node is open, 503 before and once shutdown began
//
// Standalone mode: the engine endpoint serves the manager API to
// out-of-process engines (docs/PROTOCOL.md) on --engine-listen unix:///path
// (or ipc:///path, tcp://127.0.0.1:PORT). Given no engine_listen by flag,
// environment or file, kvtierd serves on config.DefaultEngineAddress:
// $KVTIER_ADDRESS, else unix:///run/kvtier/engine.sock as root, else
// unix://$TMPDIR/kvtier-<uid>/engine.sock, creating that directory (mode
// 0755 for /run/kvtier; 0700 for the user's, 0750 in --engine-group).
// --engine-listen none (or KVTIER_ENGINE_LISTEN=none, engine_listen: none,
// or --engine-listen=) serves no engines, as does an anonymous-memfd pool.
// A stale socket file, left by a killed daemon, is replaced; one a live
// daemon serves stops this one at start ("another kvtierd serves …"). The
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
// token ids (docs/VLLM.md, "Events").
//
// KVTIERD_CPUPROFILE=FILE (environment; KVTIERD_ variables are kvtierd's
// own, not config keys): a Go CPU profile of the whole run, written to FILE
// at shutdown (`go tool pprof kvtierd FILE`).
//
// kvtierd runs under Linux's SCHED_BATCH, so that its threads, woken by an
// engine's call, do not preempt the engine's scheduler on its core
// (internal/schedbatch says why and what it measured); KVTIERD_SCHED=normal
// keeps the kernel's default policy.
//
// Exit status: 0 after a clean shutdown (or --version, --help), 2 for bad
// flags, a bad config (file, environment or flags), an engine socket a live
// daemon serves, or a failed Open, 1 for any other failure (HTTP listener,
// unclean shutdown). A second signal during shutdown kills the process at
// once.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/pprof"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/internal/gcpercent"
	"github.com/kvtier/kvtier/internal/schedbatch"
	"github.com/kvtier/kvtier/internal/version"
)

// Exit statuses.
const (
	exitOK     = 0
	exitFailed = 1
	exitConfig = 2
)

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

// startCPUProfile profiles the process into path until the returned func
// runs (KVTIERD_CPUPROFILE; docs/PERFORMANCE.md).
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
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

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

// run is the daemon; it returns the exit status.
func run(args []string, stdout io.Writer, stderr *os.File) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return exitOK
		}
		return exitConfig
	}
	if o.version {
		fmt.Fprintln(stdout, "kvtierd", version.Get())
		return exitOK
	}
	o.environ = os.Environ()
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
		return printTopology(stdout, cfg)
	}
	cfg.Logger = &base // the node adds its own component fields
	log.Debug().Int("gc_percent", gcpercent.Apply(gcpercent.Default)).Msg("garbage collector target")
	if policy, err := schedbatch.Apply(); err != nil {
		log.Warn().Err(err).Str("policy", policy).Msg("scheduling policy")
	} else {
		log.Debug().Str("policy", policy).Msg("scheduling policy")
	}

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

	if err := prepareEngineListen(cfg.EngineListen, cfg.EngineGroup); err != nil {
		log.Error().Err(err).Str("engine_listen", cfg.EngineListen).Msg("cannot serve engines")
		return exitConfig
	}

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

	if cfg.BlockBytes == 0 && cfg.EngineListen != "" {
		if status, sized := sizeFromEngine(ctx, log, &cfg, ln.Addr().String()); !sized {
			_ = srv.Close()
			<-served
			return status
		}
	}
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

// sizeFromEngine gives cfg the bytes per block the first engine declares
// (no block size from a flag, the environment or the file): the pool's
// slots take the engine's geometry. It reports false, with the exit
// status, when the wait ended without one (a signal, a failure, or a
// block larger than the pool).
func sizeFromEngine(ctx context.Context, log zerolog.Logger, cfg *kvtier.Config, metricsAddr string) (int, bool) {
	pool := cfg.WithDefaults().PoolBytes
	log.Info().Str("metrics_addr", metricsAddr).Str("engine_listen", cfg.EngineListen).Int64("pool_bytes", pool).
		Msg("kvtierd sizing its slots from the first engine (--block-bytes fixes them)")
	n, err := kvtier.AwaitEngineBlockBytes(ctx, *cfg)
	switch {
	case ctx.Err() != nil:
		log.Info().Msg("stopped before an engine came")
		return exitOK, false
	case err != nil:
		log.Error().Err(err).Str("engine_listen", cfg.EngineListen).Msg("cannot serve engines")
		return exitFailed, false
	case int64(n) > pool:
		log.Error().Int("block_bytes", n).Int64("pool_bytes", pool).
			Msg("the first engine's block does not fit the pool: give a larger --pool-bytes")
		return exitConfig, false
	}
	log.Info().Int("block_bytes", n).Int64("slots", pool/int64(n)).Msg("slots sized by the first engine")
	cfg.BlockBytes = n
	return exitOK, true
}
