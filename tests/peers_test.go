package tests

// Peers across real processes: two and three kvtierd daemons on loopback,
// each with an engine (the Go client over its engine socket and shared
// pool). Blocks stored through one daemon's engine are fetched by another
// daemon over the peer control plane (ZeroMQ) and the tcp data plane, and
// verified byte for byte through the fetching daemon's pool. A producer
// killed mid-fetch costs the consumer a recompute, never a hang, a leak or
// a corrupt block.

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/internal/testutil/freeport"
	"github.com/kvtier/kvtier/internal/testutil/tempfile"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/client"
)

const peerSecret = "tests-shared-secret-0123456789"

var httpClient = &http.Client{Timeout: 5 * time.Second}

var peerNS = messages.Layout{Model: "m", DType: "fp16", BlockTokens: 16, TPSize: 1}.Namespace()

func peerKey(i int) messages.Key {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(i))
	return messages.Key{Namespace: peerNS, Hash: string(b[:])}
}

func peerKeys(from, n int) []messages.Key {
	out := make([]messages.Key, n)
	for i := range out {
		out[i] = peerKey(from + i)
	}
	return out
}

func fillBlock(b []byte, k messages.Key) {
	seed := binary.BigEndian.Uint64([]byte(k.Hash))
	for i := range b {
		b[i] = byte(seed*131 + uint64(i)*7 + uint64(i>>9))
	}
}

// peerDaemon is a kvtierd with an engine endpoint and peers on.
type peerDaemon struct {
	*daemon
	engine, peer, metrics string
	eng                   *client.Client
}

func startPeerDaemon(t *testing.T, ctx context.Context, bin, id string, extra ...string) *peerDaemon {
	t.Helper()
	dir := t.TempDir()
	secret := tempfile.Write(t, "secret", peerSecret)
	engine := "ipc://" + filepath.Join(dir, "engine.sock")
	args := append([]string{"--pool-path", poolPath(t), "--engine-listen", engine, "--metrics-listen", "127.0.0.1:0",
		"--log-format", "json", "--node-id", id, "--peer-listen", "tcp://127.0.0.1:0", "--peer-secret-file", secret,
		"--pool-bytes", "64MiB", "--block-bytes", "64KiB"}, extra...)
	d := startDaemon(t, bin, args...)
	rec, err := d.stderr.WaitJSON(ctx, "kvtierd listening")
	require.NoError(t, err)
	p := &peerDaemon{daemon: d, engine: engine, peer: rec["peer_listen"].(string), metrics: rec["metrics_addr"].(string)}
	p.eng = dialTest(t, ctx, engine)
	return p
}

// storeBlocks stores keys through the daemon's engine and waits until
// they are readable there.
func (p *peerDaemon) storeBlocks(t *testing.T, ctx context.Context, ks []messages.Key) {
	t.Helper()
	req := &messages.ReqContext{RequestID: "store"}
	plan, err := p.eng.PrepareStore(ctx, req, ks)
	require.NoError(t, err)
	for i, k := range plan.ToStore {
		fillBlock(p.eng.Pool().Slot(plan.Slots[i]), k)
	}
	for w := 0; w < plan.Workers; w++ {
		require.NoError(t, p.eng.JobDone(ctx, plan.Job, w, true))
	}
	probe := &messages.ReqContext{RequestID: "probe"}
	require.Equal(t, allStatus(len(ks), messages.Hit), p.lookupSettled(t, ctx, probe, ks, messages.HitPending))
	require.NoError(t, p.eng.RequestFinished(ctx, probe))
}

// lookupSettled looks up until no key has status `until` (a store commits
// a moment after JobDone; a peer fetch resolves RETRY in a few steps).
func (p *peerDaemon) lookupSettled(t *testing.T, ctx context.Context, req *messages.ReqContext, ks []messages.Key, until ...messages.LookupStatus) []messages.LookupStatus {
	t.Helper()
	for {
		st, err := p.eng.Lookup(ctx, req, ks, false)
		require.NoError(t, err)
		if !anyStatus(st, until...) {
			return st
		}
		require.NoError(t, ctx.Err())
	}
}

func anyStatus(st []messages.LookupStatus, want ...messages.LookupStatus) bool {
	for _, s := range st {
		for _, w := range want {
			if s == w {
				return true
			}
		}
	}
	return false
}

func allStatus(n int, s messages.LookupStatus) []messages.LookupStatus {
	return slices.Repeat([]messages.LookupStatus{s}, n)
}

// loadAndVerify loads HITs of req and compares every byte.
func (p *peerDaemon) loadAndVerify(t *testing.T, ctx context.Context, req *messages.ReqContext, ks []messages.Key) {
	t.Helper()
	job, err := p.eng.PrepareLoad(ctx, req, ks)
	require.NoError(t, err)
	want := make([]byte, len(p.eng.Pool().Slot(0)))
	for i, k := range ks {
		fillBlock(want, k)
		require.Equal(t, want, p.eng.Pool().Slot(job.Slots[i]), "block %s", k)
	}
	require.NoError(t, p.eng.CompleteLoad(ctx, req, ks))
	require.NoError(t, p.eng.RequestFinished(ctx, req))
}

// requireQuiet asserts nothing is pinned, leased or being written.
func (p *peerDaemon) requireQuiet(t *testing.T, ctx context.Context) {
	t.Helper()
	s, err := p.eng.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, s.Pinned, "pinned")
	require.Zero(t, s.Leased, "leased")
	require.Zero(t, s.WritePending, "write-pending")
}

// waitPeerReady waits until the daemon's metrics show a ready session to node.
func (p *peerDaemon) waitPeerReady(t *testing.T, ctx context.Context, node string) {
	t.Helper()
	for {
		_, body, err := get(ctx, httpClient, "http://"+p.metrics+"/metrics")
		require.NoError(t, err)
		if v, ok := metricValue(body, `kvtier_peer_ready{peer="`+node+`"}`); ok && v == 1 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("peer %s never ready:\n%s", node, p.stderr)
		case <-time.After(20 * time.Millisecond): // NB: polling a process's metrics; no message to wait on
		}
	}
}

func TestPeersTwoDaemonsFetchVerified(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := buildDaemon(t)
	a := startPeerDaemon(t, ctx, bin, "a")
	b := startPeerDaemon(t, ctx, bin, "b", "--peer", "a="+a.peer)
	b.waitPeerReady(t, ctx, "a")

	ks := peerKeys(0, 200)
	a.storeBlocks(t, ctx, ks)
	req := &messages.ReqContext{RequestID: "r"}
	st := b.lookupSettled(t, ctx, req, ks, messages.Retry, messages.HitPending)
	require.Equal(t, allStatus(len(ks), messages.Hit), st, "every block stored on a is fetched by b")
	b.loadAndVerify(t, ctx, req, ks)
	b.requireQuiet(t, ctx)
	a.requireQuiet(t, ctx)

	_, body, err := get(ctx, httpClient, "http://"+b.metrics+"/metrics")
	require.NoError(t, err)
	v, _ := metricValue(body, `kvtier_peer_fetched_blocks_total{peer="a"}`)
	require.Equal(t, float64(len(ks)), v)
}

func TestPeersThreeDaemonsFetchFromWhoeverHasIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := buildDaemon(t)
	a := startPeerDaemon(t, ctx, bin, "a")
	b := startPeerDaemon(t, ctx, bin, "b")
	c := startPeerDaemon(t, ctx, bin, "c", "--peer", "a="+a.peer, "--peer", "b="+b.peer)
	c.waitPeerReady(t, ctx, "a")
	c.waitPeerReady(t, ctx, "b")

	onA, onB := peerKeys(0, 50), peerKeys(1000, 50)
	a.storeBlocks(t, ctx, onA)
	b.storeBlocks(t, ctx, onB)
	all := append(append([]messages.Key{}, onA...), onB...)
	req := &messages.ReqContext{RequestID: "r"}
	require.Equal(t, allStatus(len(all), messages.Hit), c.lookupSettled(t, ctx, req, all, messages.Retry, messages.HitPending))
	c.loadAndVerify(t, ctx, req, all)
	for _, d := range []*peerDaemon{a, b, c} {
		d.requireQuiet(t, ctx)
	}
}

// metric reads one sample of a daemon's /metrics (0 when absent).
func (p *peerDaemon) metric(t *testing.T, ctx context.Context, name string) float64 {
	t.Helper()
	_, body, err := get(ctx, httpClient, "http://"+p.metrics+"/metrics")
	require.NoError(t, err)
	v, _ := metricValue(body, name)
	return v
}

// A producer SIGKILLed while a consumer is fetching from it: the
// consumer's round fails (its session sees the control connection drop),
// its reserved slots are freed, its engine gets MISS and recomputes, and no
// block it did not fully receive and verify is ever readable.
func TestPeersProducerKilledMidFetch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := buildDaemon(t)
	big := []string{"--pool-bytes", "320MiB", "--block-bytes", "256KiB"}
	a := startPeerDaemon(t, ctx, bin, "a", big...)
	b := startPeerDaemon(t, ctx, bin, "b", append(big, "--peer", "a="+a.peer)...)
	b.waitPeerReady(t, ctx, "a")

	ks := peerKeys(0, 1200) // ~300 MB: a fetch that lasts long enough to be cut
	a.storeBlocks(t, ctx, ks)
	req := &messages.ReqContext{RequestID: "r"}
	st, err := b.eng.Lookup(ctx, req, ks, true)
	require.NoError(t, err)
	require.Equal(t, messages.Retry, st[0])
	// The lookup round answered (hits leased): the fetch starts at once.
	for b.metric(t, ctx, `kvtier_peer_lookup_hits_total{peer="a"}`) == 0 {
		require.NoError(t, ctx.Err())
	}
	require.NoError(t, a.cmd.Process.Kill())
	awaitClosed(t, a.exited, exitBound, "killed producer")

	// The consumer settles: every key a MISS (recompute) or a verified HIT.
	st = b.lookupSettled(t, ctx, req, ks, messages.Retry, messages.HitPending)
	var hits []messages.Key
	for i, s := range st {
		if s == messages.Hit {
			hits = append(hits, ks[i])
		}
	}
	require.Less(t, len(hits), len(ks), "the producer died before the whole fetch landed")
	if len(hits) > 0 {
		b.loadAndVerify(t, ctx, req, hits)
	} else {
		require.NoError(t, b.eng.RequestFinished(ctx, req))
	}
	b.requireQuiet(t, ctx)
	require.Positive(t, b.metric(t, ctx, `kvtier_peer_round_failures_total{peer="a"}`), "the round failed")
	require.Zero(t, b.metric(t, ctx, `kvtier_peer_corrupt_blocks_total{peer="a"}`))
	require.Zero(t, b.metric(t, ctx, `kvtier_peer_ready{peer="a"}`), "the session is down")
}

// The P2P benchmark scenarios run end to end between real node processes
// (small sizes and fast steps: this checks the scenarios work and every
// fetched byte verifies, not their figures).
func TestPeersBenchScenariosRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cli := buildCLI(t)
	run := func(args ...string) map[string]any {
		cmd := exec.CommandContext(ctx, cli, append([]string{"bench"}, args...)...)
		cmd.WaitDelay = waitDelay
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.NoError(t, err, "kvtier bench %v:\n%s", args, stderr.String())
		var res map[string]any
		require.NoError(t, json.Unmarshal(out, &res))
		return res
	}
	small := []string{"--json", "--blocks", "64", "--block-bytes", "65536", "--pool-bytes", "33554432"}
	m := run(append([]string{"p2p-matrix", "--step-ms", "150", "--visible-steps", "3", "--cold-rounds", "1",
		"--warm-rounds", "2", "--prompt", "64", "--chunk", "4", "--requests", "2"}, small...)...)
	for _, k := range []string{"idle_cold_s", "idle_warm_s", "busy_cold_s", "busy_warm_s", "busy_penalty", "store_to_peer_visible_p99_ms", "peer_lookup_p50_us", "peer_lookup_p99_us", "source_commit_phase_p50_ms"} {
		require.Positive(t, m[k], k)
	}
	require.EqualValues(t, 6, m["store_to_peer_visible_samples"])
	tp := run(append([]string{"p2p-throughput", "--rounds", "2"}, small...)...)
	for _, k := range []string{"fetch_GBps", "raw_tcp_GBps", "fetch_over_raw"} {
		require.Positive(t, tp[k], k)
	}
	secure := run(append([]string{"p2p-throughput", "--rounds", "2", "--tls"}, small...)...)
	for _, k := range []string{"fetch_GBps", "tcp_fetch_GBps", "raw_tcp_GBps"} {
		require.Positive(t, secure[k], k)
	}
	require.Equal(t, true, secure["tls"], "the fetches ran over TLS")
}

// freeTCPAddr is a loopback address with a port free now, for a daemon that
// must come back on the same address after a restart.
func freeTCPAddr(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr()
	require.NoError(t, err)
	return addr
}

// A producer SIGKILLed and started again with the same node id, control
// address and fs data directory (a crashed kvtierd restarted by its
// supervisor): the consumer's session comes back on its own, the producer's
// fs tier finds what it had cascaded, and what the consumer fetches from the
// new incarnation verifies byte for byte. Nothing the dead incarnation's
// rounds held stays leased or pinned at the consumer.
func TestPeersProducerKilledAndRestartedWithItsData(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := buildDaemon(t)
	data := t.TempDir()
	cfg := tempfile.Write(t, "kvtier.yaml", fmt.Sprintf("secondary_tiers:\n  - {kind: fs, root: %s}\n", data))
	listen := "tcp://" + freeTCPAddr(t)
	startA := func() *peerDaemon {
		return startPeerDaemon(t, ctx, bin, "a", "--config", cfg, "--peer-listen", listen)
	}
	a := startA()
	b := startPeerDaemon(t, ctx, bin, "b", "--peer", "a="+listen)
	b.waitPeerReady(t, ctx, "a")

	ks := peerKeys(0, 64)
	a.storeBlocks(t, ctx, ks)
	a.waitMetric(t, ctx, `kvtier_tier_blocks{tier="fs"}`, 64) // cascaded: on disk
	b.fetchVerified(t, ctx, "before", ks[:32])

	// Killed with a lookup round of b's in flight at it.
	_, err := b.eng.Lookup(ctx, &messages.ReqContext{RequestID: "cut"}, ks[32:], false)
	require.NoError(t, err)
	require.NoError(t, a.cmd.Process.Kill())
	awaitClosed(t, a.exited, exitBound, "killed producer")
	b.waitMetric(t, ctx, `kvtier_peer_ready{peer="a"}`, 0)
	require.NoError(t, b.eng.RequestFinished(ctx, &messages.ReqContext{RequestID: "cut"}))
	b.waitQuiet(t, ctx)

	a = startA()
	a.waitMetric(t, ctx, `kvtier_tier_blocks{tier="fs"}`, 64) // its restart scan found them
	b.waitPeerReady(t, ctx, "a")                              // b's session dialed the new incarnation
	promote := &messages.ReqContext{RequestID: "promote"}
	require.Equal(t, allStatus(32, messages.Hit), a.lookupSettled(t, ctx, promote, ks[32:], messages.Retry, messages.HitPending),
		"the new incarnation promotes its blocks from disk")
	require.NoError(t, a.eng.RequestFinished(ctx, promote))
	b.fetchVerified(t, ctx, "after", ks[32:])
	b.waitQuiet(t, ctx)
	a.waitQuiet(t, ctx)
}
