package tests

// Standalone mode with real processes: kvtierd serving its engine endpoint,
// `kvtier sim --connect` and raw ZeroMQ peers as engines.

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/client"
	"github.com/kvtier/kvtier/scheduler/wire"
)

// standalone starts kvtierd with an engine endpoint on an ipc socket and
// returns it with the endpoint and metrics addresses.
func standalone(t *testing.T, ctx context.Context, extra ...string) (d *daemon, engine, metrics string) {
	t.Helper()
	engine = "ipc://" + filepath.Join(t.TempDir(), "engine.sock")
	args := append([]string{"--pool-path", poolPath(t), "--engine-listen", engine, "--block-bytes", "256KiB",
		"--metrics-listen", "127.0.0.1:0", "--log-format", "json"}, extra...)
	d = startDaemon(t, buildDaemon(t), args...)
	rec, err := d.stderr.WaitJSON(ctx, "kvtierd listening")
	require.NoError(t, err)
	require.Equal(t, engine, rec["engine_listen"])
	return d, engine, rec["metrics_addr"].(string)
}

// runSimJSON runs `kvtier sim` with args and decodes its JSON summary.
func runSimJSON(t *testing.T, ctx context.Context, bin string, args ...string) map[string]any {
	t.Helper()
	cmd := exec.CommandContext(ctx, bin, append([]string{"sim", "--json", "--no-progress"}, args...)...)
	cmd.WaitDelay = waitDelay
	out, err := cmd.Output()
	var stderr string
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = string(ee.Stderr)
	}
	require.NoError(t, err, "kvtier sim %v: %s", args, stderr)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var sum map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &sum))
	return sum
}

// counts drops the fields of a summary that measure time.
func counts(s map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range s {
		switch k {
		// NB: unreachable capacity is sampled through the embedded node's
		// inventory only (a connected sim has no inventory to read).
		case "lookup_p50_us", "lookup_p99_us", "wall_seconds", "settle_polls", "unreachable_capacity_fraction":
		default:
			out[k] = v
		}
	}
	return out
}

// One code path: the simulator through the daemon's socket and shared pool
// gives exactly the counts of the embedded node, both on their defaults.
func TestSimThroughDaemonMatchesEmbedded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cli := buildCLI(t)
	_, engine, _ := standalone(t, ctx)
	args := []string{"--seed", "7", "--requests", "800"}
	connected := runSimJSON(t, ctx, cli, append(args, "--connect", engine)...)
	embedded := runSimJSON(t, ctx, cli, args...)
	require.EqualValues(t, 0, connected["corrupt_blocks"])
	require.Positive(t, connected["blocks_verified"].(float64))
	require.Equal(t, counts(embedded), counts(connected))
}

// dialTest connects the test's own client (it heartbeats, so it outlives
// the grace period).
func dialTest(t *testing.T, ctx context.Context, engine string) *client.Client {
	t.Helper()
	c, err := client.Dial(ctx, engine, client.Options{Name: t.Name()})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

// An engine killed mid-run (SIGKILL: no Bye, no RequestFinished, jobs in
// flight) leaves nothing pinned, leased or write-pending once its grace
// period has passed and then the quarantine of its jobs' slots (as long
// again: its workers may still be copying), and the loss is counted.
func TestKilledEngineIsReleasedAfterGrace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cli := buildCLI(t)
	d, engine, metricsAddr := standalone(t, ctx, "--engine-grace", "2s")
	observer := dialTest(t, ctx, engine)

	// Slow copies in real time keep store and load jobs in flight.
	sim := exec.Command(cli, "sim", "--connect", engine, "--seed", "3", "--no-progress",
		"--realtime", "--step-time", "5ms", "--copy-time", "20ms", "--requests", "100000")
	sim.WaitDelay = waitDelay
	require.NoError(t, sim.Start())
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = sim.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = sim.Process.Kill()
		awaitClosed(t, exited, exitBound, "engine killed at cleanup")
	})

	// Readiness: wait (bounded by ctx) until the engine holds something of
	// every kind a crash can leak.
	var held messages.Stats
	for {
		s, err := observer.Stats(ctx)
		require.NoError(t, err)
		if s.WritePending > 0 && s.JobsInFlight > 0 && s.Pinned+s.Leased > 0 {
			held = s
			break
		}
		select {
		case <-exited:
			t.Fatalf("sim exited early: %v", waitErr)
		case <-ctx.Done():
			t.Fatalf("engine never held pins, leases and writes at once: %+v", s)
		case <-time.After(2 * time.Millisecond):
		}
	}
	require.NoError(t, sim.Process.Signal(syscall.SIGKILL))
	require.True(t, awaitClosed(t, exited, exitBound, "engine killed"))
	t.Logf("killed the engine holding %d write-pending, %d pinned, %d leased slots, %d jobs",
		held.WritePending, held.Pinned, held.Leased, held.JobsInFlight)

	rec, err := d.stderr.WaitJSON(ctx, "engine session released")
	require.NoError(t, err)
	require.Equal(t, "lost", rec["reason"])
	s, err := observer.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, s.Leased, "leased slots")
	require.Zero(t, s.JobsInFlight, "jobs in flight")
	require.Zero(t, s.Requests, "requests with state")
	for s.WritePending+s.Pinned > 0 { // NB: the quarantine (2 s) runs on the daemon's clock: probed, bounded by ctx
		select {
		case <-ctx.Done():
			t.Fatalf("slots still held after the quarantine: %d write-pending, %d pinned", s.WritePending, s.Pinned)
		case <-time.After(20 * time.Millisecond):
		}
		s, err = observer.Stats(ctx)
		require.NoError(t, err)
	}

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	code, body, err := get(ctx, client, "http://"+metricsAddr+"/metrics")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `kvtier_engine_sessions_released_total{reason="lost"} 1`)

	// The daemon still serves: a fresh engine stores and loads.
	require.NoError(t, observer.Ping(ctx))
}

// rawPeer is a bare DEALER socket: it sends whatever bytes a test makes.
//
// zmq4's Recv has no timeout (docs/DESIGN.md §10), so one goroutine owns Recv and
// hands each message over a channel; roundTrip waits on it with a deadline.
// The goroutine ends when the socket closes (Recv then fails), and cleanup
// waits for that, bounded.
type rawPeer struct {
	sock    zmq4.Socket
	replies chan zmq4.Msg
	closed  chan struct{} // closed at cleanup, before the socket
	done    chan struct{} // closed when the reading goroutine ended
}

// replyBound is how long a raw peer waits for a reply the daemon owes it.
const replyBound = 10 * time.Second

func dialRaw(t *testing.T, engine string) *rawPeer {
	t.Helper()
	sock := zmq4.NewDealer(context.Background())
	dialed := make(chan error, 1)
	go func() { dialed <- sock.Dial(engine) }()
	select {
	case err := <-dialed:
		require.NoError(t, err)
	case <-time.After(replyBound):
		// NB: zmq4's handshake reads with no deadline. Close does not
		// end it; fail loudly rather than hang (the goroutine is reported
		// by goleak if it outlives the daemon).
		_ = sock.Close()
		t.Fatalf("dial %s: no ZMTP handshake within %v; goroutines:\n%s", engine, replyBound, allStacks())
	}
	p := &rawPeer{sock: sock, replies: make(chan zmq4.Msg), closed: make(chan struct{}), done: make(chan struct{})}
	go p.read()
	t.Cleanup(func() {
		close(p.closed)
		_ = sock.Close()
		awaitClosed(t, p.done, replyBound, "raw peer's reader after Close")
	})
	return p
}

// read hands every message received to roundTrip until the socket closes.
func (p *rawPeer) read() {
	defer close(p.done)
	for {
		msg, err := p.sock.Recv()
		if err != nil {
			return
		}
		select {
		case p.replies <- msg:
		case <-p.closed:
			return
		}
	}
}

// roundTrip sends frames and decodes the reply map, failing t if none comes.
func (p *rawPeer) roundTrip(t *testing.T, frames ...[]byte) map[string]any {
	t.Helper()
	require.NoError(t, p.sock.Send(zmq4.NewMsgFrom(frames...)))
	var msg zmq4.Msg
	select {
	case msg = <-p.replies:
	case <-p.done:
		t.Fatalf("raw peer: socket closed while waiting for a reply")
	case <-time.After(replyBound):
		t.Fatalf("raw peer: no reply within %v; goroutines:\n%s", replyBound, allStacks())
	}
	require.Len(t, msg.Frames, 1)
	var reply map[string]any
	require.NoError(t, msgpack.Unmarshal(msg.Frames[0], &reply))
	return reply
}

// pack encodes v with map keys in sorted order, so a frame's bytes do not
// depend on Go's map iteration order.
func pack(t *testing.T, v any) []byte {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	require.NoError(t, enc.Encode(v))
	return buf.Bytes()
}

func errCode(reply map[string]any) string {
	e, _ := reply["err"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

// Malformed frames each get an error reply (with the request's id where
// it could be read); the daemon keeps serving everyone.
func TestMalformedFramesGetErrorReplies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, engine, metricsAddr := standalone(t, ctx, "--pool-bytes", "4MiB", "--block-bytes", "64KiB")
	good := dialTest(t, ctx, engine)
	p := dialRaw(t, engine)
	hello := p.roundTrip(t, pack(t, map[string]any{"v": 1, "op": "hello", "id": 1}))
	require.Empty(t, errCode(hello))

	key := []any{"ns", []byte("hash0001"), 0}
	manyKeys := make([]any, wire.MaxKeys+1)
	for i := range manyKeys {
		manyKeys[i] = key
	}
	for _, tc := range []struct {
		name   string
		frames [][]byte
		code   string
		id     uint64
	}{
		{"garbage", [][]byte{[]byte("\xc1\xff not msgpack")}, "BAD_REQUEST", 0},
		{"not a map", [][]byte{pack(t, []any{1, 2, 3})}, "BAD_REQUEST", 0},
		{"two frames", [][]byte{pack(t, map[string]any{"v": 1, "op": "ping", "id": 2}), []byte("x")}, "BAD_REQUEST", 0},
		{"wrong version", [][]byte{pack(t, map[string]any{"v": 2, "op": "ping", "id": 3})}, "BAD_VERSION", 3},
		{"unknown op", [][]byte{pack(t, map[string]any{"v": 1, "op": "format_disk", "id": 4})}, "UNKNOWN_OP", 4},
		{"wrong type: id as string", [][]byte{pack(t, map[string]any{"v": 1, "op": "ping", "id": "5"})}, "BAD_REQUEST", 0},
		{"wrong type: keys as map", [][]byte{pack(t, map[string]any{"v": 1, "op": "lookup", "id": 6,
			"req": map[string]any{"id": "r"}, "keys": map[string]any{"a": 1}})}, "BAD_REQUEST", 6},
		{"wrong type: hash as str", [][]byte{pack(t, map[string]any{"v": 1, "op": "lookup", "id": 7,
			"req": map[string]any{"id": "r"}, "keys": []any{[]any{"ns", "hash", 0}}})}, "BAD_REQUEST", 7},
		{"oversize key list", [][]byte{pack(t, map[string]any{"v": 1, "op": "lookup", "id": 8,
			"req": map[string]any{"id": "r"}, "keys": manyKeys})}, "BAD_REQUEST", 8},
		{"oversize hash", [][]byte{pack(t, map[string]any{"v": 1, "op": "lookup", "id": 9,
			"req": map[string]any{"id": "r"}, "keys": []any{[]any{"ns", make([]byte, 65), 0}}})}, "BAD_KEY", 9},
		{"worker index out of range", [][]byte{pack(t, map[string]any{"v": 1, "op": "job_done", "id": 10,
			"job": 1, "worker": wire.MaxWorkers, "ok": true})}, "BAD_REQUEST", 10},
		{"unknown field", [][]byte{pack(t, map[string]any{"v": 1, "op": "ping", "id": 11, "slot": 99999999})}, "BAD_REQUEST", 11},
		{"missing field", [][]byte{pack(t, map[string]any{"v": 1, "op": "job_done", "id": 12, "job": 1})}, "BAD_REQUEST", 12},
		{"unknown job", [][]byte{pack(t, map[string]any{"v": 1, "op": "job_done", "id": 13, "job": 424242, "worker": 0, "ok": true})}, "UNKNOWN_JOB", 13},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reply := p.roundTrip(t, tc.frames...)
			require.Equal(t, tc.code, errCode(reply), "reply %v", reply)
			require.EqualValues(t, tc.id, reply["id"])
			require.NoError(t, good.Ping(ctx), "the daemon keeps serving")
		})
	}
	// A peer that never said hello has no session.
	stranger := dialRaw(t, engine)
	require.Equal(t, "NO_SESSION", errCode(stranger.roundTrip(t, pack(t, map[string]any{"v": 1, "op": "stats", "id": 1}))))

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	_, body, err := get(ctx, client, "http://"+metricsAddr+"/metrics")
	require.NoError(t, err)
	require.Contains(t, body, `kvtier_engine_bad_frames_total{code="BAD_REQUEST"}`)
	_, err = good.Stats(ctx)
	require.NoError(t, err)
	require.NoError(t, good.Close(ctx))
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	exit, err := d.wait(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, exit)
}
