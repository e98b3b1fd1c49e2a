package node

// Secondary tiers through a whole node: cascade after a store, RETRY on a
// CPU miss, promotion, restart persistence, corrupt and failing copies, a
// full disk, the per-request tier filter and the cascade queue bound. Real
// files in a temporary directory; faults through fs.Faulty; a real
// size-limited tmpfs where the machine lets us mount one.

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/fs"
)

func withFS(root string, tweak ...func(*config.TierConfig)) func(*config.Config) {
	return func(c *config.Config) {
		tc := config.TierConfig{Kind: "fs", Root: root}
		for _, f := range tweak {
			f(&tc)
		}
		c.SecondaryTiers = append(c.SecondaryTiers, tc)
	}
}

func (h *harness) idle() {
	h.t.Helper()
	require.NoError(h.t, h.node.TieringIdle(h.ctx))
}

func (h *harness) tiering() messages.TieringStats {
	h.t.Helper()
	s, err := h.node.TieringStats(h.ctx)
	require.NoError(h.t, err)
	return s
}

func (h *harness) lookup(req *messages.ReqContext, ks []messages.Key, prefix bool) []messages.LookupStatus {
	h.t.Helper()
	st, err := h.m.Lookup(h.ctx, req, ks, prefix)
	require.NoError(h.t, err)
	return st
}

func statuses(n int, s messages.LookupStatus) []messages.LookupStatus {
	return slices.Repeat([]messages.LookupStatus{s}, n)
}

// loadAndVerify loads ids (all HITs of req) and checks every byte.
func (h *harness) loadAndVerify(req *messages.ReqContext, ids ...int) {
	h.t.Helper()
	ks := keys(ids...)
	job, err := h.m.PrepareLoad(h.ctx, req, ks)
	require.NoError(h.t, err)
	want := make([]byte, testBlock)
	for i, id := range ids {
		fill(want, id)
		require.Equal(h.t, want, h.m.Pool().Slot(job.Slots[i]), "block %d", id)
	}
	require.NoError(h.t, h.m.CompleteLoad(h.ctx, req, ks))
	require.NoError(h.t, h.m.RequestFinished(h.ctx, req))
}

func ids(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

// evictAll stores other blocks until none of ids is in the CPU tier.
func (h *harness) evictAll(slots int) {
	h.t.Helper()
	h.store(&messages.ReqContext{RequestID: "evictor"}, ids(1_000_000, slots)...)
	h.idle()
}

// cascadeThenPromote stores blocks 0..7, which cascade to the tier kind,
// evicts them from the CPU and looks them up as a prefix: RETRY first, then,
// once promoted, a HIT for all, every byte verified. It returns the first
// lookup's statuses and the tiering stats once quiet.
func (h *harness) cascadeThenPromote(kind, promotedMsg string) ([]messages.LookupStatus, messages.TieringStats) {
	h.t.Helper()
	h.store(&messages.ReqContext{RequestID: "w"}, ids(0, 8)...)
	h.idle()
	require.Equal(h.t, uint64(8), h.tiering().CascadeWritten[kind])
	h.evictAll(8)
	h.quiet()

	req := &messages.ReqContext{RequestID: "r"}
	ks := keys(ids(0, 8)...)
	first := h.lookup(req, ks, true)
	require.Equal(h.t, messages.Retry, first[0], "a CPU miss found in %s is RETRY first", kind)
	h.idle()
	require.Equal(h.t, statuses(8, messages.Hit), h.lookup(req, ks, true), promotedMsg)
	h.loadAndVerify(req, ids(0, 8)...)
	h.quiet()
	ts := h.tiering()
	require.Equal(h.t, uint64(8), ts.Promoted[kind])
	return first, ts
}

// fsLayouts runs a test against each fs tier layout (secondary_tiers'
// layout:), through a whole node.
func fsLayouts(t *testing.T, test func(t *testing.T, layout func(*config.TierConfig))) {
	for _, name := range []string{"files", "segments"} {
		t.Run(name, func(t *testing.T) { test(t, func(tc *config.TierConfig) { tc.Layout = name }) })
	}
}

func TestSecondaryCascadeThenPromotion(t *testing.T) {
	fsLayouts(t, func(t *testing.T, layout func(*config.TierConfig)) {
		h := open(t, 8, withFS(t.TempDir(), layout))
		first, ts := h.cascadeThenPromote("fs", "promoted: the next lookup hits the whole prefix")
		require.Equal(t, statuses(7, messages.Miss), first[1:], "prefix: the scan stops at the RETRY")
		require.Equal(t, 0, ts.InFlightCascades+ts.InFlightLookups+ts.InFlightPromotions)
		require.False(t, h.pending(), "secondary work is never engine work")
	})
}

func TestSecondaryNonPrefixLookupAndAbsentKeys(t *testing.T) {
	h := open(t, 8, withFS(t.TempDir()))
	h.store(&messages.ReqContext{RequestID: "w"}, 1, 3)
	h.idle()
	h.evictAll(8)
	req := &messages.ReqContext{RequestID: "r"}
	ks := keys(1, 2, 3)
	require.Equal(t, statuses(3, messages.Retry), h.lookup(req, ks, false))
	h.idle()
	require.Equal(t, []messages.LookupStatus{messages.Hit, messages.Miss, messages.Hit}, h.lookup(req, ks, false),
		"absent key 2 is a MISS from the negative cache, not another RETRY")
	h.loadAndVerify(req, 1, 3)
}

// The node restarts on the same root: the blocks it cascaded before are
// found, promoted and every byte verified.
func TestSecondaryRestartPersistence(t *testing.T) {
	fsLayouts(t, func(t *testing.T, layout func(*config.TierConfig)) {
		root := t.TempDir()
		all := ids(0, 24)
		func() {
			h := open(t, 32, withFS(root, layout))
			h.store(&messages.ReqContext{RequestID: "w"}, all...)
			h.idle()
			require.Equal(t, uint64(len(all)), h.tiering().CascadeWritten["fs"])
			require.NoError(t, h.node.Close(h.ctx))
		}()
		h := open(t, 32, withFS(root, layout))
		ts := h.tiering()
		require.Equal(t, len(all), ts.Tiers[0].ScannedBlocks, "the index is rebuilt from the directory")
		req := &messages.ReqContext{RequestID: "after-restart"}
		ks := keys(all...)
		require.Equal(t, messages.Retry, h.lookup(req, ks, true)[0])
		h.idle()
		require.Equal(t, statuses(len(all), messages.Hit), h.lookup(req, ks, true))
		h.loadAndVerify(req, all...)
		h.quiet()
	})
}

// A block whose bytes rot on disk is found, fails verification on
// promotion, is deleted and becomes a MISS: the request does not RETRY it
// forever.
func TestSecondaryCorruptCopyIsDeletedNotServed(t *testing.T) {
	for _, layout := range []string{"files", "segments"} {
		t.Run(layout, func(t *testing.T) { testSecondaryCorruptCopy(t, layout) })
	}
}

func testSecondaryCorruptCopy(t *testing.T, layout string) {
	root := t.TempDir()
	h := open(t, 4, withFS(root, func(tc *config.TierConfig) { tc.Layout = layout }))
	h.store(&messages.ReqContext{RequestID: "w"}, 7)
	h.idle()
	h.evictAll(4)
	// NB: the block's last byte ends its block file; in a segment, found
	// by its bytes (fill's, as the store wrote them).
	path, last := filepath.Join(root, string(testNS), "00", "0000000000000007-0.blk"), -1
	if layout == "segments" {
		segs, err := filepath.Glob(filepath.Join(root, "segments", "*.seg"))
		require.NoError(t, err)
		require.Len(t, segs, 1)
		path = segs[0]
	}
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	if layout == "segments" {
		block := make([]byte, testBlock)
		fill(block, 7)
		at := bytes.Index(data, block)
		require.GreaterOrEqual(t, at, 0, "block 7 in its segment")
		last = at + testBlock - 1 - len(data)
	}
	data[len(data)+last] ^= 0xff
	require.NoError(t, os.WriteFile(path, data, 0o644))

	req := &messages.ReqContext{RequestID: "r"}
	require.Equal(t, []messages.LookupStatus{messages.Retry}, h.lookup(req, keys(7), true))
	h.idle()
	for range 3 {
		require.Equal(t, []messages.LookupStatus{messages.Miss}, h.lookup(req, keys(7), true), "no livelock on a bad copy")
	}
	h.idle()
	ts := h.tiering()
	require.Equal(t, uint64(1), ts.PromotionsFailed["fs"])
	require.Equal(t, uint64(1), ts.Tiers[0].Invalid)
	require.Zero(t, ts.Promoted["fs"])
	if layout == "files" {
		_, err = os.Stat(path)
		require.ErrorIs(t, err, os.ErrNotExist, "the bad copy is removed")
	} // NB: a segment's dead record goes with its segment
	h.quiet()
}

// A read error (EIO) fails the promotion cleanly: MISS, no slot held, the
// file kept (it may be fine; the negative entry expires).
func TestSecondaryReadErrorIsAMiss(t *testing.T) {
	faulty := fs.NewFaulty(fs.OS{})
	h := open(t, 4, withFS(t.TempDir(), func(tc *config.TierConfig) { tc.FS = faulty }))
	h.store(&messages.ReqContext{RequestID: "w"}, 5)
	h.idle()
	h.evictAll(4)
	defer faulty.Inject(func(op fs.Op, _ string) error {
		if op == fs.OpRead {
			return syscall.EIO
		}
		return nil
	})()
	req := &messages.ReqContext{RequestID: "r"}
	require.Equal(t, messages.Retry, h.lookup(req, keys(5), true)[0])
	h.idle()
	require.Equal(t, messages.Miss, h.lookup(req, keys(5), true)[0])
	require.Equal(t, uint64(1), h.tiering().PromotionsFailed["fs"])
	h.quiet()
}

func TestSecondaryTierFilter(t *testing.T) {
	h := open(t, 4, withFS(t.TempDir()))
	h.store(&messages.ReqContext{RequestID: "w"}, 1)
	h.idle()
	h.evictAll(4)
	cpuOnly := &messages.ReqContext{RequestID: "cpu-only", TierFilter: []string{"cpu"}}
	require.Equal(t, messages.Miss, h.lookup(cpuOnly, keys(1), true)[0], "fs is not in the filter")
	require.Zero(t, h.tiering().LookupsStarted)
	withFSReq := &messages.ReqContext{RequestID: "fs", TierFilter: []string{"cpu", "fs"}}
	require.Equal(t, messages.Retry, h.lookup(withFSReq, keys(1), true)[0])
	h.idle()
	require.Equal(t, messages.Hit, h.lookup(withFSReq, keys(1), true)[0])
	h.loadAndVerify(withFSReq, 1)
}

// The cascade queue bound sheds writes (counted) instead of pinning the
// CPU pool behind a stalled disk; once the disk moves again every pin goes.
func TestSecondaryCascadeShedsPastItsQueue(t *testing.T) {
	faulty := fs.NewFaulty(fs.OS{})
	gate := make(chan struct{})
	h := open(t, 16, withFS(t.TempDir(), func(tc *config.TierConfig) { tc.FS = faulty }), func(c *config.Config) { c.CascadeQueue = 2 })
	remove := faulty.Inject(func(op fs.Op, _ string) error {
		if op == fs.OpCreate {
			<-gate // a stalled device
		}
		return nil
	})
	h.store(&messages.ReqContext{RequestID: "w"}, ids(0, 8)...)
	h.store(&messages.ReqContext{RequestID: "w2"}, ids(8, 4)...)
	ts := h.tiering()
	require.Equal(t, uint64(10), ts.CascadeDropped["fs"], "2 in flight, the other 10 shed")
	require.LessOrEqual(t, h.stats().Pinned, 2, "at most the queue bound is pinned")
	close(gate)
	remove()
	h.idle()
	require.Equal(t, uint64(2), h.tiering().CascadeWritten["fs"])
	h.quiet()
}

// Disk full through fault injection: writes fail cleanly and are counted,
// blocks stored before stay readable, nothing half-written is left.
func TestSecondaryDiskFullInjected(t *testing.T) {
	faulty := fs.NewFaulty(fs.OS{})
	root := t.TempDir()
	h := open(t, 8, withFS(root, func(tc *config.TierConfig) { tc.FS = faulty }))
	h.store(&messages.ReqContext{RequestID: "before"}, ids(0, 4)...)
	h.idle()
	remove := faulty.Inject(func(op fs.Op, _ string) error {
		if op == fs.OpWrite {
			return syscall.ENOSPC
		}
		return nil
	})
	h.store(&messages.ReqContext{RequestID: "full"}, ids(100, 4)...)
	h.idle()
	remove()
	ts := h.tiering()
	require.Equal(t, uint64(4), ts.Tiers[0].WritesFull, "ENOSPC counted as a full tier")
	require.Equal(t, uint64(4), ts.CascadeDropped["fs"])
	require.Equal(t, 4, ts.Tiers[0].Blocks)
	requireNoTempFiles(t, root)
	h.evictAll(8)
	req := &messages.ReqContext{RequestID: "r"}
	h.lookup(req, keys(ids(0, 4)...), true)
	h.idle()
	require.Equal(t, statuses(4, messages.Hit), h.lookup(req, keys(ids(0, 4)...), true), "blocks from before the disk filled still load")
	h.loadAndVerify(req, ids(0, 4)...)
	require.Equal(t, messages.Retry, h.lookup(req, keys(100), true)[0], "never written: looked up")
	h.idle()
	require.Equal(t, messages.Miss, h.lookup(req, keys(100), true)[0])
	h.quiet()
}

func requireNoTempFiles(t *testing.T, root string) {
	t.Helper()
	require.NoError(t, filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err == nil && strings.Contains(info.Name(), ".tmp.") {
			return errors.New("temporary file left behind: " + p)
		}
		return err
	}))
}

// Disk full for real: a 1 MiB tmpfs, mounted when we may (root). Blocks
// are written until the filesystem refuses; every refusal is counted, and
// every block the tier kept loads back byte for byte.
func TestSecondaryDiskFullTmpfs(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a size-limited tmpfs here (%v: %s); TestSecondaryDiskFullInjected covers ENOSPC by fault injection", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })
	const n = 400 // 400 × (4 KiB + header) is well over 1 MiB
	h := open(t, n, withFS(dir))
	for i := 0; i < n; i += 50 {
		h.store(&messages.ReqContext{RequestID: "w"}, ids(i, 50)...)
		h.idle()
	}
	ts := h.tiering()
	kept := ts.Tiers[0].Blocks
	require.Positive(t, ts.Tiers[0].WritesFull, "the filesystem filled up")
	require.Positive(t, kept)
	require.Equal(t, uint64(n), uint64(kept)+ts.Tiers[0].WritesFull+ts.Tiers[0].WriteFailures)
	requireNoTempFiles(t, dir)
	h.evictAll(n)
	req := &messages.ReqContext{RequestID: "r"}
	all := keys(ids(0, n)...)
	h.lookup(req, all, false)
	h.idle()
	st := h.lookup(req, all, false)
	var hits []int
	for i, s := range st {
		require.NotEqual(t, messages.Retry, s)
		if s == messages.Hit {
			hits = append(hits, i)
		}
	}
	require.Len(t, hits, kept, "every kept block is promoted")
	h.loadAndVerify(req, hits...)
	h.quiet()
}

// metricTotals sums, by metric name, the counter and gauge values of the
// node's series labelled label=value; of every series when label is "".
func (h *harness) metricTotals(label, value string) map[string]float64 {
	h.t.Helper()
	mfs, err := h.node.Registry().Gather()
	require.NoError(h.t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labelled := label == ""
			for _, l := range m.GetLabel() {
				labelled = labelled || l.GetName() == label && l.GetValue() == value
			}
			if labelled {
				got[mf.GetName()] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return got
}

func TestSecondaryMetrics(t *testing.T) {
	h := open(t, 4, withFS(t.TempDir()))
	h.store(&messages.ReqContext{RequestID: "w"}, 1, 2)
	h.idle()
	got := h.metricTotals("", "")
	require.Equal(t, 2.0, got["kvtier_cascade_written_total"])
	require.Equal(t, 0.0, got["kvtier_cascade_dropped_total"])
	require.Equal(t, 2.0, got["kvtier_tier_blocks"])
	require.Equal(t, 1.0, got["kvtier_tier_healthy"])
}

// A prefix longer than the fs tier's I/O queue (256) is promoted whole in
// one request: a full queue is back-pressure, never a reason to call a block
// on disk absent (which made the engine recompute what the disk held).
func TestSecondaryPromotesAPrefixLongerThanTheIOQueueWhole(t *testing.T) {
	const n = 400
	root := t.TempDir()
	h := open(t, n, withFS(root))
	h.store(&messages.ReqContext{RequestID: "w"}, ids(0, n)...)
	h.idle()
	require.Equal(t, uint64(n), h.tiering().CascadeWritten["fs"])
	h.evictAll(n)
	h.quiet()

	req := &messages.ReqContext{RequestID: "r"}
	ks := keys(ids(0, n)...)
	require.Equal(t, messages.Retry, h.lookup(req, ks, true)[0])
	h.idle()
	require.Equal(t, statuses(n, messages.Hit), h.lookup(req, ks, true), "every block promoted in one go")
	h.loadAndVerify(req, ids(0, n)...)
	ts := h.tiering()
	require.Equal(t, uint64(n), ts.Promoted["fs"])
	require.Zero(t, ts.NegativeEntries, "nothing on disk was called absent")
}
