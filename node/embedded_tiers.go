package node

import (
	"context"

	"github.com/kvtier/kvtier/messages"
)

// The embedded manager also exposes the node's secondary-tier settling and
// counters, for the simulator (tools/sim looks for these methods).

// TieringIdle waits until no secondary lookup, promotion or cascade is in
// flight (Node.TieringIdle).
func (m *embedded) TieringIdle(ctx context.Context) error { return m.node.TieringIdle(ctx) }

// TieringStats returns the secondary tiers' counters (Node.TieringStats).
func (m *embedded) TieringStats(ctx context.Context) (messages.TieringStats, error) {
	return m.node.TieringStats(ctx)
}

// Inventory lists what the node holds per medium (Node.Inventory).
func (m *embedded) Inventory(ctx context.Context) (map[string][]messages.Key, error) {
	return m.node.Inventory(ctx)
}
