package kvtier_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/internal/testutil/testclose"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/client"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/cpu/residency"
)

// An engine that never waits in its scheduler step, in vLLM's real call
// order: its stores go into credited slots, its request ends before its
// store completes (the completion does not re-open the request), the
// residency index shows the block being written, then readable, a lookup answers the
// HIT's slot, a duplicate store leaves its slot in the credit, and the
// session's credit is freed only after the quarantine.
func TestCreditedStoresInVLLMsOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node, clock := openEngineNode(t, ctx, "ipc", 16)

	c, err := client.Dial(ctx, node.EngineAddr(), client.Options{Name: "vllm"})
	require.NoError(t, err)
	h := c.Hello()
	require.True(t, h.Credit)
	require.True(t, h.IndexComplete, "a CPU-only node's index covers every tier")
	idx, err := residency.Open(h.IndexPath)
	require.NoError(t, err)
	defer idx.Close()

	grant, err := c.Grant(ctx, 4)
	require.NoError(t, err)
	require.Len(t, grant.Slots, 4)
	keys := sessionKeys(1, 2)
	w := &messages.ReqContext{RequestID: "w"}
	bound, err := c.StoreCredited(ctx, w, keys, grant.Slots[:2])
	require.NoError(t, err)
	require.Equal(t, []bool{true, true}, bound.Bound)
	require.Equal(t, residency.StateWriting, idx.State(residency.KeyFingerprint(keys[0])), "a write in flight is shown being written, not readable")

	require.NoError(t, c.RequestFinished(ctx, w))
	require.NoError(t, c.CompleteStore(ctx, w, keys, true), "a late completion lands")
	st, err := c.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.SessionOpen, "the late completion did not re-open the request")
	for _, k := range keys {
		require.Equal(t, residency.StateCPU, idx.State(residency.KeyFingerprint(k)))
	}

	r := &messages.ReqContext{RequestID: "r"}
	status, slots, err := c.LookupSlots(ctx, r, keys, true)
	require.NoError(t, err)
	require.Equal(t, []messages.LookupStatus{messages.Hit, messages.Hit}, status)
	require.Equal(t, grant.Slots[:2], slots, "each HIT is where the engine copied it")
	require.NoError(t, c.RequestFinished(ctx, r))

	dup, err := c.StoreCredited(ctx, &messages.ReqContext{RequestID: "w2"}, keys[:1], grant.Slots[2:3])
	require.NoError(t, err)
	require.Equal(t, []bool{false}, dup.Bound, "already held: settled by the daemon")
	require.Zero(t, dup.Job)
	_, err = c.StoreCredited(ctx, &messages.ReqContext{RequestID: "w3"}, sessionKeys(3), grant.Slots[:1])
	require.ErrorIs(t, err, messages.ErrBadRequest, "a bound slot is no longer credit")

	free := func() int {
		s, err := node.Manager().Stats(ctx)
		require.NoError(t, err)
		return s.Free
	}
	before := free()
	require.NoError(t, c.Close(ctx))
	require.Equal(t, before, free(), "the ended session's credit stays out of use during the quarantine")
	clock.Advance(10 * time.Second)
	require.Equal(t, before+2, free(), "then its two unused slots are free")
}

// A session that ends with jobs in flight (its engine gone, or declared
// lost) leaves their slots out of use for the quarantine: its worker may
// still be copying a load out of a pinned slot or a store into a
// write-pending one. The store's key is no longer pending (a lookup
// misses), and only after the quarantine are the slots freed and the pin
// dropped (issue 26, item 2).
func TestAnEndedSessionsJobsAreQuarantined(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node, clock := openEngineNode(t, ctx, "unix", 8)
	stats := func() messages.Stats {
		s, err := node.Manager().Stats(ctx)
		require.NoError(t, err)
		return s
	}

	held := sessionKeys(1)
	w := &messages.ReqContext{RequestID: "w"}
	plan, err := node.Manager().PrepareStore(ctx, w, held)
	require.NoError(t, err)
	require.NoError(t, node.Manager().JobDone(ctx, plan.Job, 0, true), "a block the node holds")

	c, err := client.Dial(ctx, node.EngineAddr(), client.Options{Name: "vllm"})
	require.NoError(t, err)
	r := &messages.ReqContext{RequestID: "r"}
	_, err = c.PrepareLoad(ctx, r, held)
	require.NoError(t, err)
	writing := sessionKeys(2, 3)
	store, err := c.PrepareStore(ctx, r, writing)
	require.NoError(t, err)
	require.Len(t, store.Slots, 2)
	before := stats()
	require.Equal(t, 1, before.Pinned)
	require.Equal(t, 2, before.WritePending)

	require.NoError(t, c.Close(ctx)) // the engine is gone; its worker may not be
	during := stats()
	require.Equal(t, before.Free, during.Free, "no slot of the ended session's jobs is free during the quarantine")
	require.Equal(t, 1, during.Pinned, "the load's slot stays pinned: its copy may be in flight")
	status, err := node.Manager().Lookup(ctx, &messages.ReqContext{RequestID: "x"}, writing, false)
	require.NoError(t, err)
	require.Equal(t, []messages.LookupStatus{messages.Miss, messages.Miss}, status, "the orphaned writes will never commit")

	clock.Advance(10 * time.Second)
	after := stats()
	require.Equal(t, before.Free+2, after.Free, "then the store's two slots are free")
	require.Zero(t, after.Pinned)
	require.Zero(t, after.WritePending)
}

// openEngineNode opens a node of slots 4 KiB slots serving engines on
// transport ("ipc" or "unix"), its engine grace (10 s) and every timer on
// the returned manual clock; closed at the test's end.
func openEngineNode(t *testing.T, ctx context.Context, transport string, slots int) (*kvtier.Node, *supervision.ManualClock) {
	t.Helper()
	clock := supervision.NewManualClock(time.Unix(1_700_000_000, 0))
	return openEngineTestNode(t, ctx, transport, kvtier.Config{PoolBytes: int64(slots) * 4096, Clock: clock}), clock
}

// openEngineTestNode is the one way this package's engine tests open a
// node, so that they differ only in what they set in cfg (clocks, slots,
// engine_poll): it fills in a fresh directory's pool (16 slots of 4 KiB
// unless cfg.PoolBytes says otherwise) and engine socket on transport
// ("ipc" or "unix"), and a 10 s engine grace. The node is closed, and its
// close checked, at the test's end.
func openEngineTestNode(t *testing.T, ctx context.Context, transport string, cfg kvtier.Config) *kvtier.Node {
	t.Helper()
	dir := t.TempDir()
	if cfg.PoolBytes == 0 {
		cfg.PoolBytes = 16 * 4096
	}
	cfg.PoolPath = filepath.Join(dir, "pool")
	cfg.BlockBytes = 4096
	cfg.EngineListen = transport + "://" + filepath.Join(dir, "engine.sock")
	cfg.EngineGrace = 10 * time.Second
	node, err := kvtier.Open(ctx, cfg)
	require.NoError(t, err)
	testclose.AtCleanup(t, 30*time.Second, node.Close)
	require.Equal(t, cfg.EngineListen, node.EngineAddr(), "the node serves engines where it was told to")
	return node
}
