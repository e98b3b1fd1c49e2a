package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/events"
)

// newEventsCmd builds `kvtier events` and its `tail` subcommand.
func newEventsCmd() *cobra.Command {
	return withCommands(&cobra.Command{Use: "events", Short: "KV events: subscribe to a node's vLLM-format event stream"}, newEventsTailCmd())
}

type tailOptions struct {
	replay     string
	replayFrom int64
	topic      string
	json       bool
	noFollow   bool
}

func newEventsTailCmd() *cobra.Command {
	o := tailOptions{}
	cmd := &cobra.Command{
		Use:   "tail ADDR",
		Short: "Print the KV events a node publishes on ADDR (its events endpoint)",
		Long: `tail subscribes to a node's KV events (ZeroMQ PUB at ADDR, e.g. tcp://127.0.0.1:5557)
and prints every event decoded: one human-readable line each, or one JSON object
per line with --json. With --replay ADDR and --replay-from N it first asks the
node's replay socket for the buffered batches from sequence N, then follows the
live stream without duplicates, filling any gap from the replay socket.
Legacy (array) and current (map) vLLM event forms are both understood.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runTail(cmd.Context(), args[0], o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.replay, "replay", "", "the node's replay `address` (ROUTER), e.g. tcp://127.0.0.1:5558")
	f.Int64Var(&o.replayFrom, "replay-from", -1, "replay buffered batches from this sequence number first (needs --replay)")
	f.StringVar(&o.topic, "topic", "", "topic prefix to subscribe to (default: every topic)")
	f.BoolVar(&o.json, "json", false, "one JSON object per event per line")
	f.BoolVar(&o.noFollow, "no-follow", false, "exit after the replay (needs --replay-from)")
	return cmd
}

func runTail(ctx context.Context, addr string, o tailOptions, out, errOut io.Writer) error {
	if o.replayFrom >= 0 && o.replay == "" {
		return fmt.Errorf("--replay-from needs --replay")
	}
	if o.noFollow && o.replayFrom < 0 {
		return fmt.Errorf("--no-follow needs --replay-from")
	}
	ctx, stop := untilInterrupted(ctx)
	defer stop()
	enc := json.NewEncoder(out)
	err := events.Subscribe(ctx, events.SubscriberConfig{Endpoint: addr, Replay: o.replay, Topic: o.topic,
		ReplayFrom: o.replayFrom, NoFollow: o.noFollow}, func(d events.Delivery) error {
		if d.Missed > 0 {
			fmt.Fprintf(errOut, "kvtier: %d batches before seq %d were lost (not in the replay buffer)\n", d.Missed, d.Seq)
		}
		for _, e := range d.Batch.Events {
			if o.json {
				if err := enc.Encode(jsonLine{Seq: d.Seq, TS: d.Batch.TS, DPRank: d.Batch.DPRank, Replayed: d.Replayed, Event: e}); err != nil {
					return err
				}
				continue
			}
			if _, err := fmt.Fprintln(out, humanLine(d, e)); err != nil {
				return err
			}
		}
		return nil
	})
	if ctx.Err() != nil && (err == nil || err == ctx.Err()) {
		return nil // interrupted: a normal end for tail
	}
	return err
}

// jsonLine is one event of `tail --json`: the batch's seq, ts and rank
// beside the event's own vLLM fields.
type jsonLine struct {
	Seq      uint64  `json:"seq"`
	TS       float64 `json:"ts"`
	DPRank   int64   `json:"data_parallel_rank"`
	Replayed bool    `json:"replayed,omitempty"`
	events.Event
}

// humanLine renders one event on one line.
func humanLine(d events.Delivery, e events.Event) string {
	var b strings.Builder
	ts := time.Unix(0, int64(d.Batch.TS*1e9)).UTC().Format("15:04:05.000000")
	fmt.Fprintf(&b, "seq=%d %s %-16s", d.Seq, ts, e.Type)
	if e.Medium != "" {
		fmt.Fprintf(&b, " medium=%s", e.Medium)
	}
	if e.GroupIdx != nil {
		fmt.Fprintf(&b, " group=%d", *e.GroupIdx)
	}
	if e.Type == events.TypeAllBlocksCleared {
		return b.String()
	}
	fmt.Fprintf(&b, " blocks=%d [%s]", len(e.BlockHashes), hashList(e.BlockHashes))
	if e.Type == events.TypeBlockStored {
		parent := "none"
		if e.Parent != nil {
			parent = e.Parent.String()
		}
		fmt.Fprintf(&b, " parent=%s block_size=%d tokens=%d", parent, e.BlockSize, len(e.TokenIDs))
		if e.LoRAID != nil || e.LoRAName != "" {
			fmt.Fprintf(&b, " lora=%s", e.LoRAName)
			if e.LoRAID != nil {
				fmt.Fprintf(&b, "#%d", *e.LoRAID)
			}
		}
		if len(e.ExtraKeys) > 0 {
			fmt.Fprintf(&b, " extra_keys=%v", e.ExtraKeys[0])
		}
	}
	if e.Ownership != "" {
		fmt.Fprintf(&b, " ownership=%s", e.Ownership)
	}
	if e.Locality != "" {
		fmt.Fprintf(&b, " locality=%s", e.Locality)
	}
	if d.Replayed {
		b.WriteString(" (replayed)")
	}
	return b.String()
}

func hashList(hs []events.Hash) string {
	const show = 4
	parts := make([]string, 0, min(len(hs), show)+1)
	for i, h := range hs {
		if i == show {
			parts = append(parts, fmt.Sprintf("…+%d", len(hs)-show))
			break
		}
		parts = append(parts, h.String())
	}
	return strings.Join(parts, " ")
}
