package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/internal/testutil/testnet"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/client"
)

// runCLI runs the kvtier command line with args and returns its output.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// statusJSON is `kvtier status ADDR --json`, decoded.
func statusJSON(t *testing.T, addr string) Status {
	t.Helper()
	out, err := runCLI(t, "status", addr, "--json")
	require.NoError(t, err, out)
	var st Status
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	return st
}

// An engine stores two blocks and looks up three through a real node's
// unix:// endpoint: status reports the pool's geometry and use, the one
// engine connected (not itself), and the lookups as the node counted them;
// clear empties the CPU tier under the live engine, which keeps its
// session and stores again.
func TestStatusAndClearOnARunningNode(t *testing.T) {
	for _, transport := range []string{"unix", "ipc"} {
		t.Run(transport, func(t *testing.T) { testStatusAndClear(t, transport) })
	}
}

func testStatusAndClear(t *testing.T, transport string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	node, err := kvtier.Open(ctx, kvtier.Config{PoolPath: filepath.Join(dir, "pool"), PoolBytes: 16 * 4096,
		BlockBytes: 4096, EngineListen: transport + "://" + filepath.Join(dir, "engine.sock")})
	require.NoError(t, err)
	defer func() { require.NoError(t, node.Close(ctx)) }()
	addr := node.EngineAddr()

	st := statusJSON(t, addr)
	assert.Equal(t, 0, st.Engines, "the status command's own session is not an engine")
	assert.Equal(t, Status{Address: addr, Protocol: st.Protocol, Index: st.Index, IndexAll: st.IndexAll,
		Pool: PoolStatus{Path: filepath.Join(dir, "pool"), Slots: 16, BlockBytes: 4096, Bytes: 16 * 4096, CommittedBytes: 16 * 4096, Free: 16,
			Geometries: []GeometryStatus{{BlockBytes: 4096, Slots: 16, Committed: 16, Free: 16, Bytes: 16 * 4096}}},
		Sessions: []EngineStatus{}}, st, "an empty node")

	eng, err := client.Dial(ctx, addr, client.Options{Name: "engine", BlockBytes: 3000})
	require.NoError(t, err)
	defer eng.Close(context.Background())
	keys := statusKeys(1, 2, 3)
	store(t, eng, "r1", keys[:2])
	req := &messages.ReqContext{RequestID: "r2"}
	got, err := eng.Lookup(ctx, req, keys, true)
	require.NoError(t, err)
	require.Equal(t, []messages.LookupStatus{messages.Hit, messages.Hit, messages.Miss}, got)
	require.NoError(t, eng.RequestFinished(ctx, req))

	st = statusJSON(t, addr)
	assert.Equal(t, 1, st.Engines)
	assert.Equal(t, uint64(3), st.Lookups)
	assert.Equal(t, uint64(2), st.Hits)
	assert.Equal(t, uint64(1), st.Misses)
	assert.InDelta(t, 2.0/3, st.HitRate, 1e-9)
	assert.Equal(t, uint64(2), st.Stores)
	assert.Equal(t, 2, st.Pool.Ready)
	assert.Equal(t, int64(16-st.Pool.Free)*4096, st.Pool.UsedBytes)
	require.Len(t, st.Sessions, 1)
	e := st.Sessions[0]
	assert.Equal(t, eng.Hello().Session, e.ID)
	assert.Equal(t, "engine", e.Client)
	assert.Equal(t, "status-test", e.Namespace)
	assert.Equal(t, 3000, e.BlockBytes)
	assert.Equal(t, uint64(3), e.Lookups)
	assert.Equal(t, uint64(2), e.Hits)
	assert.InDelta(t, 2.0/3, e.HitRate, 1e-9)
	assert.Equal(t, uint64(5), e.Calls, "a store (prepare_store, job_done, request_finished), a lookup, its request_finished")
	assert.Zero(t, e.Open)

	text, err := runCLI(t, "status", addr)
	require.NoError(t, err)
	for _, want := range []string{"1 connected", "hit 2 (66.7%)", "16 slots of 4.0 KiB", "engine 2", "hit 66.7%", "namespace status-test"} {
		assert.Contains(t, text, want)
	}

	// An engine of another block size: the pool shows each geometry's use.
	big, err := client.Dial(ctx, addr, client.Options{Name: "big", BlockBytes: 8192})
	require.NoError(t, err)
	store(t, big, "b1", statusKeys(9))
	st = statusJSON(t, addr)
	require.Len(t, st.Pool.Geometries, 2)
	assert.Equal(t, GeometryStatus{BlockBytes: 8192, Slots: 8, Committed: 1, Ready: 1, Bytes: 8192, UsedBytes: 8192}, st.Pool.Geometries[1])
	assert.LessOrEqual(t, st.Pool.CommittedBytes, st.Pool.Bytes, "within the budget")
	text, err = runCLI(t, "status", addr)
	require.NoError(t, err)
	assert.Contains(t, text, "blocks of 8.0 KiB")
	require.NoError(t, big.Close(ctx))

	out, err := runCLI(t, "clear", addr)
	require.NoError(t, err, out)
	assert.Equal(t, "cleared "+addr+": 3 readable blocks before, 0 now\n", out)
	st = statusJSON(t, addr)
	assert.Zero(t, st.Pool.Ready)
	assert.Equal(t, 1, st.Engines, "the engine kept its session")

	req = &messages.ReqContext{RequestID: "r3"}
	got, err = eng.Lookup(ctx, req, keys[:1], true)
	require.NoError(t, err)
	assert.Equal(t, []messages.LookupStatus{messages.Miss}, got, "cleared")
	require.NoError(t, eng.RequestFinished(ctx, req))
	store(t, eng, "r4", keys[:1])
	assert.Equal(t, 1, statusJSON(t, addr).Pool.Ready, "the engine refills it")
}

func TestStatusWithoutANodeSaysWhere(t *testing.T) {
	addr := "unix://" + filepath.Join(t.TempDir(), "none.sock")
	_, err := runCLI(t, "status", addr, "--timeout", "2s")
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "no kvtierd at "+addr), err.Error())
}

// store writes keys through eng's store path and commits them.
func store(t *testing.T, eng *client.Client, id string, keys []messages.Key) {
	t.Helper()
	ctx := context.Background()
	req := &messages.ReqContext{RequestID: id, Workers: 1}
	plan, err := eng.PrepareStore(ctx, req, keys)
	require.NoError(t, err)
	require.Len(t, plan.ToStore, len(keys))
	require.NoError(t, eng.JobDone(ctx, plan.Job, 0, true))
	require.NoError(t, eng.RequestFinished(ctx, req))
}

func statusKeys(ids ...byte) []messages.Key {
	out := make([]messages.Key, len(ids))
	for i, id := range ids {
		out[i] = messages.Key{Namespace: "status-test", Hash: string([]byte{id, 0, 0, 0, 0, 0, 0, id})}
	}
	return out
}

// A kvtierd still sizing its slots (no block size, no engine yet) is
// named as such, not as absent.
func TestStatusOfADaemonWaitingForItsFirstEngine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr := "unix://" + filepath.Join(testnet.SocketDir(t), "e.sock")
	waitCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := kvtier.AwaitEngineBlockBytes(waitCtx, kvtier.Config{EngineListen: addr})
		done <- err
	}()
	var err error
	for {
		_, err = runCLI(t, "status", addr, "--timeout", "5s")
		if err == nil || !strings.HasPrefix(err.Error(), "no kvtierd at ") {
			break // NB: until the socket is bound
		}
		select {
		case err := <-done:
			t.Fatalf("the wait ended: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	require.Error(t, err)
	assert.Equal(t, "kvtierd at "+addr+" has no pool yet: it sizes its slots from the first engine that connects (or start it with --block-bytes)", err.Error())
	stop()
	assert.ErrorIs(t, <-done, context.Canceled)
}
