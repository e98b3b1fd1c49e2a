package main

// `kvtier status` and `kvtier clear`: an operator's view of a running
// kvtierd, over its engine endpoint (the socket's file mode is the access
// rule, as for engines).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/client"
	"github.com/kvtier/kvtier/scheduler/wire"
)

// Status is what `kvtier status --json` prints (docs/OPERATIONS.md,
// "kvtier status"): one running node's pool, engines and counters.
type Status struct {
	Address   string     `json:"address"`   // the engine endpoint asked
	Protocol  int        `json:"protocol"`  // engine protocol version
	Namespace string     `json:"namespace"` // the only key namespace served; "" = any
	Pool      PoolStatus `json:"pool"`
	// Engines is the engine sessions connected, this command's own left out;
	// Sessions lists them, oldest first.
	Engines      int            `json:"engines"`
	Sessions     []EngineStatus `json:"sessions"`
	Requests     int            `json:"requests"`       // requests holding leases or jobs
	JobsInFlight int            `json:"jobs_in_flight"` // engine jobs awaiting worker reports
	Paused       bool           `json:"paused"`
	Index        string         `json:"index_path"`     // residency index engines read; "" = none
	IndexAll     bool           `json:"index_complete"` // the index covers every tier (no secondary asks)
	// Counters since the daemon started.
	Lookups          uint64  `json:"lookups"`      // keys looked up
	Hits             uint64  `json:"hits"`         // keys answered HIT
	HitsPending      uint64  `json:"hits_pending"` // keys answered HIT_PENDING
	Misses           uint64  `json:"misses"`
	HitRate          float64 `json:"hit_rate"` // hits / lookups (0 before any)
	Stores           uint64  `json:"stores"`   // blocks committed readable
	StoresFailed     uint64  `json:"stores_failed"`
	Evictions        uint64  `json:"evictions"`
	StoreFull        uint64  `json:"store_full"` // PrepareStore calls answered Full
	ChecksumFailures uint64  `json:"checksum_failures"`
	ActorRestarts    uint64  `json:"actor_restarts"`
}

// EngineStatus is one engine session of the node.
type EngineStatus struct {
	ID         uint64    `json:"id"`          // the session's number
	Client     string    `json:"client"`      // the name its hello gave (vLLM: vllm-scheduler)
	Topic      string    `json:"topic"`       // its KV-events topic: kvtierd announces its blocks under it ("" = none)
	Namespace  string    `json:"namespace"`   // its keys' layout namespace ("" before a keyed call)
	BlockBytes int       `json:"block_bytes"` // bytes per block its hello declared (0: none)
	Since      time.Time `json:"since"`       // when it said hello
	Calls      uint64    `json:"calls"`       // calls it made
	Lookups    uint64    `json:"lookups"`     // keys it looked up
	Hits       uint64    `json:"hits"`        // of those, answered HIT
	HitRate    float64   `json:"hit_rate"`    // hits / lookups (0 before any)
	Open       int       `json:"open"`        // its requests holding leases or jobs
}

// PoolStatus is the CPU pool's geometry and use, in slots and bytes.
type PoolStatus struct {
	Path           string `json:"path"`
	Slots          int    `json:"slots"`       // slots with memory behind them, every geometry's
	BlockBytes     int    `json:"block_bytes"` // bytes per slot of the first geometry
	Bytes          int64  `json:"bytes"`       // the budget every geometry shares (pool_bytes)
	CommittedBytes int64  `json:"committed_bytes"`
	UsedBytes      int64  `json:"used_bytes"` // bytes of the slots not free
	// Geometries is each block size the pool serves, the first first.
	Geometries   []GeometryStatus `json:"geometries"`
	Free         int              `json:"free"`
	Ready        int              `json:"ready"` // readable blocks
	WritePending int              `json:"write_pending"`
	Credit       int              `json:"credit"` // reserved ahead for engines' stores
	Pinned       int              `json:"pinned"`
	Leased       int              `json:"leased"`
}

// GeometryStatus is one block size's share of the pool.
type GeometryStatus struct {
	BlockBytes int   `json:"block_bytes"`
	Slots      int   `json:"slots"`     // slot ids it may use (as many as the budget holds)
	Committed  int   `json:"committed"` // slots with memory behind them
	Free       int   `json:"free"`      // of those, free
	Ready      int   `json:"ready"`     // readable blocks
	Bytes      int64 `json:"bytes"`     // committed × block_bytes
	UsedBytes  int64 `json:"used_bytes"`
}

// newStatus builds a Status from a session's hello and stats.
func newStatus(addr string, h wire.Hello, s messages.Stats) Status {
	st := Status{Address: addr, Protocol: h.Protocol, Namespace: string(h.Namespace),
		Engines: max(s.Sessions-1, 0), Requests: s.Requests, JobsInFlight: s.JobsInFlight,
		Paused: s.Paused, Index: h.IndexPath, IndexAll: h.IndexComplete,
		Lookups: s.Lookups, Hits: s.Hits, HitsPending: s.HitsPending, Misses: s.Misses,
		Stores: s.Stores, StoresFailed: s.StoresFailed, Evictions: s.Evictions, StoreFull: s.Full,
		ChecksumFailures: s.ChecksumFailures, ActorRestarts: s.ActorRestarts}
	st.HitRate = rate(s.Hits, s.Lookups)
	st.Sessions = []EngineStatus{}
	for _, e := range s.Engines {
		if e.ID == h.Session {
			continue // this command's own
		}
		st.Sessions = append(st.Sessions, EngineStatus{ID: e.ID, Client: e.Client, Topic: e.Topic, Namespace: string(e.Namespace),
			BlockBytes: e.BlockBytes, Since: e.Since.UTC(), Calls: e.Calls, Lookups: e.Lookups, Hits: e.Hits,
			HitRate: rate(e.Hits, e.Lookups), Open: e.Open})
	}
	st.Pool = PoolStatus{Path: h.PoolPath, Slots: s.Slots, BlockBytes: s.BlockBytes,
		Bytes: s.PoolBytes, CommittedBytes: s.CommittedBytes, UsedBytes: s.UsedBytes, Free: s.Free, Ready: s.Ready,
		WritePending: s.WritePending, Credit: s.Credit, Pinned: s.Pinned, Leased: s.Leased,
		Geometries: []GeometryStatus{}}
	for _, g := range s.Geometries {
		bb := int64(g.BlockBytes)
		st.Pool.Geometries = append(st.Pool.Geometries, GeometryStatus{BlockBytes: g.BlockBytes, Slots: g.Slots,
			Committed: g.Committed, Free: g.Free, Ready: g.Ready, Bytes: int64(g.Committed) * bb,
			UsedBytes: int64(g.Committed-g.Free) * bb})
	}
	return st
}

// rate is hits / lookups, 0 before any lookup.
func rate(hits, lookups uint64) float64 {
	if lookups == 0 {
		return 0
	}
	return float64(hits) / float64(lookups)
}

// printStatus writes st as an aligned table.
func printStatus(w io.Writer, st Status) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, format string, a ...any) { fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, a...)...) }
	row("address", "%s (protocol %d)", st.Address, st.Protocol)
	row("pool", "%s of %s used: %d slots of %s (%s)", humanBytes(st.Pool.UsedBytes), humanBytes(st.Pool.Bytes),
		st.Pool.Slots, humanBytes(int64(st.Pool.BlockBytes)), st.Pool.Path)
	row("slots", "ready %d, writing %d, credit %d, free %d (pinned %d, leased %d)", st.Pool.Ready,
		st.Pool.WritePending, st.Pool.Credit, st.Pool.Free, st.Pool.Pinned, st.Pool.Leased)
	if len(st.Pool.Geometries) > 1 {
		for _, g := range st.Pool.Geometries {
			row(fmt.Sprintf("blocks of %s", humanBytes(int64(g.BlockBytes))), "%s of %s used: %d ready, %d free of %d slots with memory",
				humanBytes(g.UsedBytes), humanBytes(g.Bytes), g.Ready, g.Free, g.Committed)
		}
	}
	row("engines", "%d connected, %d requests, %d jobs in flight%s", st.Engines, st.Requests, st.JobsInFlight,
		map[bool]string{true: ", PAUSED", false: ""}[st.Paused])
	row("namespace", "%s", orAny(st.Namespace))
	row("lookups", "%d keys: hit %d (%.1f%%), pending %d, miss %d", st.Lookups, st.Hits, 100*st.HitRate,
		st.HitsPending, st.Misses)
	row("stores", "%d committed, %d failed, %d evicted, %d refused full", st.Stores, st.StoresFailed,
		st.Evictions, st.StoreFull)
	row("health", "checksum failures %d, actor restarts %d", st.ChecksumFailures, st.ActorRestarts)
	for _, e := range st.Sessions {
		row(fmt.Sprintf("engine %d", e.ID), "%s since %s: %d calls, %d keys looked up, hit %.1f%%, %d open, namespace %s, block %s%s",
			e.Client, e.Since.Format(time.RFC3339), e.Calls, e.Lookups, 100*e.HitRate, e.Open, orAny(e.Namespace),
			humanBytes(int64(e.BlockBytes)), topicNote(e.Topic))
	}
	return tw.Flush()
}

// topicNote names the topic an engine's blocks are announced under.
func topicNote(topic string) string {
	if topic == "" {
		return ""
	}
	return ", events as " + topic
}

// humanBytes is n in the largest binary unit that keeps it ≥ 1.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n), -1
	for v >= unit && i < 3 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGT"[i])
}

// dialNode opens an operator's session on the node at addr.
func dialNode(ctx context.Context, addr, name string) (*client.Client, error) {
	c, err := client.Dial(ctx, addr, client.Options{Name: name})
	if errors.Is(err, messages.ErrSizing) {
		return nil, fmt.Errorf("kvtierd at %s has no pool yet: it sizes its slots from the first engine that connects (or start it with --block-bytes)", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("no kvtierd at %s: %w", addr, err)
	}
	return c, nil
}

// engineAddress is the command's ADDR argument, or kvtierd's default.
func engineAddress(args []string) string {
	if len(args) > 0 {
		return args[0]
	}
	return config.DefaultEngineAddress()
}

// newStatusCmd is `kvtier status [ADDR]`.
func newStatusCmd() *cobra.Command {
	var asJSON bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "status [ADDR]",
		Short: "What a running kvtierd holds: pool use, engines connected, hit rate",
		Long: `status asks the kvtierd serving engines at ADDR (default: $KVTIER_ADDRESS, else
kvtierd's default socket) for its pool's geometry and use, the engine sessions
connected, and its lookup and store counters since start. --json prints one
object (fields: docs/OPERATIONS.md, "kvtier status").`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return onNode(cmd, args, timeout, "kvtier-status", func(ctx context.Context, c *client.Client, addr string) error {
				return printStatusOf(cmd, c, addr, asJSON)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "bound on the whole command")
	return cmd
}

// printStatusOf prints the status of the node c is a session of.
func printStatusOf(cmd *cobra.Command, c *client.Client, addr string, asJSON bool) error {
	stats, err := c.Stats(cmd.Context())
	if err != nil {
		return fmt.Errorf("stats from %s: %w", addr, err)
	}
	st := newStatus(addr, c.Hello(), stats)
	if asJSON {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	return printStatus(cmd.OutOrStdout(), st)
}

// newClearCmd is `kvtier clear [ADDR]`.
func newClearCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "clear [ADDR]",
		Short: "Empty a running kvtierd's CPU tier without breaking the engines using it",
		Long: `clear empties the CPU tier of the kvtierd at ADDR (default: $KVTIER_ADDRESS, else
kvtierd's default socket) as the protocol's reset_cache does: engine jobs in
flight drain until --timeout (those left are reaped), then every readable block
goes. Engines keep their sessions and refill it; a lookup racing the clear
answers MISS, never a block being freed. Secondary tiers (fs, S3) and peers
are not cleared.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return onNode(cmd, args, timeout, "kvtier-clear", func(ctx context.Context, c *client.Client, addr string) error {
				return clearNode(ctx, cmd, c, addr)
			})
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "bound on the drain of engine jobs in flight, and the command")
	return cmd
}

// clearNode empties the CPU tier of the node c is a session of.
func clearNode(ctx context.Context, cmd *cobra.Command, c *client.Client, addr string) error {
	before, err := c.Stats(ctx)
	if err != nil {
		return fmt.Errorf("stats from %s: %w", addr, err)
	}
	if err := c.ResetCache(ctx); err != nil {
		return fmt.Errorf("clear %s: %w", addr, err)
	}
	after, err := c.Stats(ctx)
	if err != nil {
		return fmt.Errorf("stats from %s: %w", addr, err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "cleared %s: %d readable blocks before, %d now\n", addr, before.Ready, after.Ready)
	return nil
}

// onNode runs do on a session of the node at the command's ADDR (or the
// default address), bounded by timeout, and closes the session after.
func onNode(cmd *cobra.Command, args []string, timeout time.Duration, name string,
	do func(ctx context.Context, c *client.Client, addr string) error) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
	defer cancel()
	addr := engineAddress(args)
	c, err := dialNode(ctx, addr, name)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	cmd.SetContext(ctx)
	return do(ctx, c, addr)
}

// orAny is ns, or "any" for none.
func orAny(ns string) string {
	if ns == "" {
		return "any"
	}
	return ns
}
