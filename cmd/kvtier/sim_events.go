package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/events"
)

// eventFlags publish an embedded node's KV events during a simulator run
// and, at its end, write the node's inventory so that a subscriber's view
// (`kvtier events tail`) can be checked against what the tiers hold.
type eventFlags struct {
	endpoint  string // PUB address
	replay    string // replay ROUTER address
	inventory string // file the end-of-run inventory is written to
	hold      bool   // keep the node (and its sockets) up after the run until SIGINT/SIGTERM
}

func (e *eventFlags) register(f *pflag.FlagSet) {
	f.StringVar(&e.endpoint, "events-endpoint", "", "publish the embedded node's KV events on this PUB address (e.g. tcp://127.0.0.1:5557)")
	f.StringVar(&e.replay, "events-replay", "", "serve event replay on this ROUTER address (needs --events-endpoint)")
	f.StringVar(&e.inventory, "inventory", "", "at the end, write the embedded node's inventory (per medium, block hashes as events carry them) to this JSON file")
	f.BoolVar(&e.hold, "events-hold", false, "after the run, keep the node and its event sockets up until SIGINT/SIGTERM (for a late `events tail --replay-from 0`)")
}

func (e *eventFlags) apply(cfg *kvtier.Config) {
	cfg.Events.Endpoint, cfg.Events.Replay = e.endpoint, e.replay
}

func (e *eventFlags) embeddedOnly() bool {
	return e.endpoint != "" || e.replay != "" || e.inventory != "" || e.hold
}

// finish runs after the simulation, before the node closes: it writes the
// inventory, flushes the open event batch (bounded together), and holds
// the node if asked.
func (e *eventFlags) finish(node *kvtier.Node) error {
	if node == nil || !e.embeddedOnly() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// NB: the inventory first: every event of what it lists was sent to the
	// hub before the tiers answered (an fs tier answers once it announced
	// what it found at start), so the flush that follows publishes them.
	if e.inventory != "" {
		if err := e.writeInventory(ctx, node); err != nil {
			return err
		}
	}
	next, err := node.FlushEvents(ctx)
	if err != nil {
		return fmt.Errorf("flush events: %w", err)
	}
	if e.hold {
		fmt.Fprintf(os.Stderr, "kvtier sim: holding the node: %d event batches published (seq 0..%d), replay at %s; SIGINT/SIGTERM to stop\n",
			next, int64(next)-1, node.EventsReplayEndpoint())
		wait, stop := untilInterrupted(context.Background())
		defer stop()
		<-wait.Done()
	}
	return nil
}

// writeInventory writes {medium: [hash, ...]} with hashes in the events'
// wire form (the same hash_format as the node's events).
func (e *eventFlags) writeInventory(ctx context.Context, node *kvtier.Node) error {
	inv, err := node.Inventory(ctx)
	if err != nil {
		return fmt.Errorf("inventory: %w", err)
	}
	format, err := events.ParseHashFormat(node.EventsHashFormat())
	if err != nil {
		return err
	}
	out := map[string][]events.Hash{}
	for medium, keys := range inv {
		hashes := make([]events.Hash, len(keys))
		for i, k := range keys {
			hashes[i] = events.WireHash(k.Hash, format)
		}
		out[medium] = hashes
	}
	data, err := json.Marshal(out)
	if err != nil {
		return err
	}
	return os.WriteFile(e.inventory, data, 0o644)
}
