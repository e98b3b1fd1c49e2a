package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/client"
)

// EndpointOptions sizes the standalone-mode scenario.
type EndpointOptions struct {
	Slots      int           // pool slots
	BlockBytes int           // bytes per slot
	LookupKeys int           // keys per Lookup (2,000 in the target)
	Lookups    int           // Lookup calls measured per path
	CopyBlocks int           // blocks per store+load round of the shm figure
	CopyRounds int           // rounds measured
	Transport  string        // the endpoint's transport: "ipc" (ZeroMQ) or "unix" (length-prefixed stream)
	Timeout    time.Duration // whole-run bound
}

// DefaultEndpointOptions is what `kvtier bench endpoint` runs with no flags.
func DefaultEndpointOptions() EndpointOptions {
	return EndpointOptions{Slots: 4096, BlockBytes: 256 << 10, LookupKeys: 2000, Lookups: 300,
		CopyBlocks: 64, CopyRounds: 40, Transport: "unix", Timeout: 5 * time.Minute}
}

// EndpointResult is the scenario's report: each figure through the socket
// next to its same-run baseline.
type EndpointResult struct {
	Lookup16P50us         float64 `json:"lookup_16_p50_us"` // through the socket
	Lookup16P99us         float64 `json:"lookup_16_p99_us"`
	Lookup64P50us         float64 `json:"lookup_64_p50_us"`
	Lookup64P99us         float64 `json:"lookup_64_p99_us"`
	EmbeddedLookup16P50us float64 `json:"embedded_lookup_16_p50_us"`
	EmbeddedLookup64P50us float64 `json:"embedded_lookup_64_p50_us"`
	FloorZmqIPCus         float64 `json:"floor_zmq_ipc_rtt_us"`     // p50 of a 256-byte echo through zmq4 DEALER/ROUTER over ipc
	FloorZmqIPCP99us      float64 `json:"floor_zmq_ipc_rtt_p99_us"` //
	FloorUnixus           float64 `json:"floor_unix_rtt_us"`        // p50 of the same echo through a Unix stream socket
	FloorUnixP99us        float64 `json:"floor_unix_rtt_p99_us"`
	Lookup16OverZmqFloor  float64 `json:"lookup_16_over_zmq_floor"` // lookup_16_p50 / floor_zmq_ipc_rtt

	LookupP50us         float64 `json:"lookup_2000_p50_us"`          // through the socket
	LookupP99us         float64 `json:"lookup_2000_p99_us"`          // through the socket
	EmbeddedLookupP50us float64 `json:"embedded_lookup_2000_p50_us"` // same node, in process
	EmbeddedLookupP99us float64 `json:"embedded_lookup_2000_p99_us"`
	SocketOverheadP99us float64 `json:"socket_overhead_p99_us"` // socket p99 − embedded p99
	ShmGBps             float64 `json:"shm_GBps"`               // store+load bytes through the shared pool ÷ wall time
	MemcpyGBps          float64 `json:"memcpy_GBps"`            // copy() of the same bytes
	ShmOverMemcpy       float64 `json:"shm_over_memcpy"`
	LookupKeys          int     `json:"lookup_keys"`
	Lookups             int     `json:"lookups"`
	CopyBlocks          int     `json:"copy_blocks"`
	CopyRounds          int     `json:"copy_rounds"`
	Transport           string  `json:"transport"`
	Slots               int     `json:"slots"`
	BlockBytes          int     `json:"block_bytes"`
}

// RunEndpoint opens a node with an engine endpoint on an ipc socket,
// connects the Go client, and measures (1) a Lookup of LookupKeys HITs
// through the socket and through the embedded manager of the same node,
// alternating, and (2) GPU-free store+load through the shared pool: the
// client's copies into and out of the mapped slots with every protocol call
// a real engine makes, against copy() of the same bytes between two buffers.
func RunEndpoint(ctx context.Context, o EndpointOptions) (EndpointResult, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	if o.Transport != "ipc" && o.Transport != "unix" {
		return EndpointResult{}, fmt.Errorf("%w: transport %q: want ipc or unix", messages.ErrBadConfig, o.Transport)
	}
	res := EndpointResult{Transport: o.Transport, LookupKeys: o.LookupKeys, Lookups: o.Lookups, CopyBlocks: o.CopyBlocks,
		CopyRounds: o.CopyRounds, Slots: o.Slots, BlockBytes: o.BlockBytes}
	if o.LookupKeys+o.CopyBlocks > o.Slots {
		return res, fmt.Errorf("%w: %d slots hold neither %d lookup keys and %d copy blocks", messages.ErrBadConfig, o.Slots, o.LookupKeys, o.CopyBlocks)
	}
	dir, err := os.MkdirTemp("", "kvtier-bench-endpoint-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	shm := "/dev/shm"
	if st, err := os.Stat(shm); err != nil || !st.IsDir() {
		shm = dir
	}
	node, err := kvtier.Open(ctx, kvtier.Config{
		PoolPath:  filepath.Join(shm, fmt.Sprintf("kvtier-bench-%d.pool", os.Getpid())),
		PoolBytes: int64(o.Slots) * int64(o.BlockBytes), BlockBytes: o.BlockBytes,
		EngineListen: o.Transport + "://" + filepath.Join(dir, "engine.sock")})
	if err != nil {
		return res, err
	}
	defer node.Close(context.Background())
	c, err := client.Dial(ctx, node.EngineAddr(), client.Options{Name: "kvtier bench endpoint"})
	if err != nil {
		return res, err
	}
	defer c.Close(context.Background())
	if err := lookupBoth(ctx, o, node.Manager(), c, &res); err != nil {
		return res, err
	}
	if res.FloorZmqIPCus, res.FloorZmqIPCP99us, err = zmqIPCFloor(ctx, dir, 4*o.Lookups); err != nil {
		return res, fmt.Errorf("zmq ipc floor: %w", err)
	}
	if res.FloorUnixus, res.FloorUnixP99us, err = unixFloor(dir, 4*o.Lookups); err != nil {
		return res, fmt.Errorf("unix floor: %w", err)
	}
	res.Lookup16OverZmqFloor = res.Lookup16P50us / res.FloorZmqIPCus
	if err := shmRoundTrips(ctx, o, c, &res); err != nil {
		return res, err
	}
	res.MemcpyGBps = memcpyGBps(o)
	res.ShmOverMemcpy = res.ShmGBps / res.MemcpyGBps
	return res, nil
}

// lookupBoth measures Lookups of 16, 64 and LookupKeys stored keys through
// the socket and through the embedded manager of the same node, each
// socket call followed by its embedded twin.
func lookupBoth(ctx context.Context, o EndpointOptions, embedded, remote kvtier.Manager, res *EndpointResult) error {
	if err := fillPool(ctx, embedded, o.LookupKeys); err != nil {
		return err
	}
	for _, n := range []int{16, 64, o.LookupKeys} {
		viaSocket, inProcess, err := lookupPaths(ctx, o.Lookups, min(n, o.LookupKeys), embedded, remote)
		if err != nil {
			return err
		}
		sockP50, sockP99 := percentileUs(viaSocket, 0.50), percentileUs(viaSocket, 0.99)
		embP50, embP99 := percentileUs(inProcess, 0.50), percentileUs(inProcess, 0.99)
		switch n {
		case 16:
			res.Lookup16P50us, res.Lookup16P99us, res.EmbeddedLookup16P50us = sockP50, sockP99, embP50
		case 64:
			res.Lookup64P50us, res.Lookup64P99us, res.EmbeddedLookup64P50us = sockP50, sockP99, embP50
		default:
			res.LookupP50us, res.LookupP99us = sockP50, sockP99
			res.EmbeddedLookupP50us, res.EmbeddedLookupP99us = embP50, embP99
			res.SocketOverheadP99us = res.LookupP99us - res.EmbeddedLookupP99us
		}
	}
	return nil
}

// lookupPaths times rounds Lookups of the first n stored keys through each
// manager, alternating.
func lookupPaths(ctx context.Context, rounds, n int, embedded, remote kvtier.Manager) (viaSocket, inProcess []time.Duration, err error) {
	keys := keyRange(0, n)
	measure := func(m kvtier.Manager, i int) (time.Duration, error) {
		req := &messages.ReqContext{RequestID: fmt.Sprintf("lookup-%d-%d", n, i)}
		start := time.Now()
		st, err := m.Lookup(ctx, req, keys, true)
		d := time.Since(start)
		if err != nil {
			return 0, err
		}
		if st[len(st)-1] != messages.Hit {
			return 0, fmt.Errorf("bench: lookup answered %s for a stored key", st[len(st)-1])
		}
		return d, m.RequestFinished(ctx, req)
	}
	for i := range rounds {
		d, err := measure(remote, i)
		if err != nil {
			return nil, nil, fmt.Errorf("socket lookup: %w", err)
		}
		viaSocket = append(viaSocket, d)
		if d, err = measure(embedded, i); err != nil {
			return nil, nil, fmt.Errorf("embedded lookup: %w", err)
		}
		inProcess = append(inProcess, d)
	}
	return viaSocket, inProcess, nil
}

// shmRoundTrips stores CopyBlocks blocks from a source buffer and loads
// them back into a destination buffer, CopyRounds times, as an engine's
// workers would with GPU memory: PrepareStore, copy into the slots, JobDone;
// Lookup, PrepareLoad, copy out of the slots, JobDone, RequestFinished.
func shmRoundTrips(ctx context.Context, o EndpointOptions, m kvtier.Manager, res *EndpointResult) error {
	src := make([]byte, o.CopyBlocks*o.BlockBytes)
	for i := range src {
		src[i] = byte(i * 7)
	}
	dst := make([]byte, len(src))
	pool := m.Pool()
	start := time.Now()
	for r := range o.CopyRounds {
		keys := keyRange(1<<30+r*o.CopyBlocks, o.CopyBlocks)
		req := &messages.ReqContext{RequestID: fmt.Sprintf("copy-%d", r)}
		plan, err := m.PrepareStore(ctx, req, keys)
		if err != nil {
			return fmt.Errorf("shm store: %w", err)
		}
		for i, s := range plan.Slots {
			copy(pool.Slot(s), src[i*o.BlockBytes:(i+1)*o.BlockBytes])
		}
		if err := m.JobDone(ctx, plan.Job, 0, true); err != nil {
			return fmt.Errorf("shm store: %w", err)
		}
		if _, err := m.Lookup(ctx, req, keys, true); err != nil {
			return fmt.Errorf("shm lookup: %w", err)
		}
		job, err := m.PrepareLoad(ctx, req, keys)
		if err != nil {
			return fmt.Errorf("shm load: %w", err)
		}
		for i, s := range job.Slots {
			copy(dst[i*o.BlockBytes:(i+1)*o.BlockBytes], pool.Slot(s))
		}
		if err := m.JobDone(ctx, job.ID, 0, true); err != nil {
			return fmt.Errorf("shm load: %w", err)
		}
		if err := m.RequestFinished(ctx, req); err != nil {
			return err
		}
	}
	elapsed := time.Since(start)
	if string(src) != string(dst) {
		return fmt.Errorf("bench: bytes loaded through the pool differ from those stored")
	}
	res.ShmGBps = float64(2*o.CopyRounds*len(src)) / elapsed.Seconds() / 1e9
	return nil
}

// memcpyGBps copies the same bytes as shmRoundTrips (store and load) with
// copy() between two private buffers.
func memcpyGBps(o EndpointOptions) float64 {
	a := make([]byte, o.CopyBlocks*o.BlockBytes)
	b := make([]byte, len(a))
	for i := range a {
		a[i] = byte(i)
	}
	start := time.Now()
	for range o.CopyRounds {
		copy(b, a)
		copy(a, b)
	}
	return float64(2*o.CopyRounds*len(a)) / time.Since(start).Seconds() / 1e9
}
