package chaos

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/obj"
	"github.com/kvtier/kvtier/tiers/obj/objtest"
)

// Scenario is a topology a run drives: which nodes, which tiers, which
// fault kinds it can inject. The peer scenario (three nodes with P2P
// tiers, peer fault kinds wired into their transports) implements it
// beside single; the engine, the gate, the invariants, the report and the
// shrinker are shared.
type Scenario interface {
	Name() string
	// Kinds are the fault kinds the scenario can inject.
	Kinds() []Kind
	// open starts the scenario's nodes with their fault wrappers wired to
	// rs.gate and its injectors recording into rs.ledger.
	open(ctx context.Context, rs *runState, env *env) ([]*nodeUnderTest, error)
}

// env is what a scenario gets beside the run: the S3 server and a
// directory of its own.
type env struct {
	s3  *objtest.Server
	dir string
}

// Scenarios lists the scenarios by name.
var Scenarios = map[string]Scenario{"single": single{}, "peers": peers{}}

// ScenarioByName returns the named scenario.
func ScenarioByName(name string) (Scenario, error) {
	if name == "" {
		name = "single"
	}
	s, ok := Scenarios[name]
	if !ok {
		names := slices.Sorted(maps.Keys(Scenarios))
		return nil, fmt.Errorf("unknown scenario %q (have: %s)",
			name, strings.Join(names, ", "))
	}
	return s, nil
}

// Geometry of the single scenario's node: a CPU pool small enough that
// the workload evicts to the secondary tiers within seconds, and deadlines
// short enough that faults are absorbed within a run.
const (
	chaosBlockBytes   = 16 << 10
	chaosSlots        = 256
	chaosFSBlocks     = 1024
	chaosLeaseTTL     = 2 * time.Second
	chaosJobTimeout   = 500 * time.Millisecond
	chaosCallTimeout  = 5 * time.Second
	chaosLookupWindow = 300 * time.Millisecond
)

// panicSpacing keeps every actor well under its supervisor's restart
// limit: at most half the restarts the guardian allows per window.
var panicSpacing = actors.RestartWindow / (actors.MaxRestarts / 2)

// single is one node with a CPU tier, an fs tier and an obj tier against
// a real versitygw; engines simulated.
type single struct{}

func (single) Name() string { return "single" }

func (single) Kinds() []Kind {
	return []Kind{supervision.FaultDrop, supervision.FaultDelay, supervision.FaultDuplicate, supervision.FaultReorder,
		supervision.FaultPanic, supervision.FaultStall, supervision.FaultFSError, supervision.FaultFSSlow,
		supervision.FaultFSCorrupt, supervision.FaultDiskFull, supervision.FaultObjError, supervision.FaultObjSlow,
		supervision.FaultObjCorrupt, supervision.FaultObjOutage, supervision.FaultClockJump}
}

var bucketSeq atomic.Uint64

func (single) open(ctx context.Context, rs *runState, e *env) ([]*nodeUnderTest, error) {
	n, err := openNode(ctx, rs, e, "n0")
	if err != nil {
		return nil, err
	}
	return []*nodeUnderTest{n}, nil
}

// singleConfig is the node configuration of the single scenario (without
// its fault wrappers); rs.nodeCfg is set from it.
func singleConfig() kvtier.Config {
	return kvtier.Config{
		PoolBytes: chaosSlots * chaosBlockBytes, BlockBytes: chaosBlockBytes, LeaseTTL: chaosLeaseTTL,
		JobWorkers: 2, LoadJobTimeout: chaosJobTimeout, StoreJobTimeout: chaosJobTimeout,
		CallTimeout: chaosCallTimeout, SecondaryLookupDeadline: chaosLookupWindow,
		Events: kvtier.EventsConfig{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", HashFormat: "bytes",
			Linger: 50 * time.Millisecond},
	}
}

// openNode opens one node of the scenario: an fs and an obj tier, events
// on loopback, an injector recording into the run's ledger.
func openNode(ctx context.Context, rs *runState, e *env, name string) (*nodeUnderTest, error) {
	n := &nodeUnderTest{name: name}
	rs.ledger.OnRecord(func(f supervision.Fault) {
		if f.Decision.Kind == supervision.FaultPanic && strings.HasPrefix(f.Point.Site, "kvtier/bridge ") {
			n.epoch.Add(1)
		}
	})
	if err := openInto(ctx, rs, e, n, name, nil); err != nil {
		return nil, err
	}
	return n, nil
}

// openInto opens an incarnation of node n (its first, or a restart after
// a kill) with its tiers under dir: fresh tiers, a fresh injector, fresh
// event models. tweak adjusts the configuration (the peer scenario's
// peers).
func openInto(ctx context.Context, rs *runState, e *env, n *nodeUnderTest, dir string, tweak func(*kvtier.Config)) error {
	name := n.name
	bucket := fmt.Sprintf("chaos-%d-%d-%s", rs.opts.Seed, bucketSeq.Add(1), name)
	if err := makeBucket(ctx, e.s3, bucket); err != nil {
		return err
	}
	s3, err := obj.NewMinio(obj.Endpoint{Endpoint: e.s3.Endpoint, Bucket: bucket,
		AccessKey: objtest.AccessKey, SecretKey: objtest.SecretKey, Conns: 16})
	if err != nil {
		return err
	}
	inj := supervision.NewInjector(supervision.InjectorConfig{Ledger: rs.ledger, PanicSpacing: panicSpacing})
	for _, r := range rs.hooks.UnsafeRules {
		inj.Inject(r)
	}
	inj.Inject(rs.gate.messageRule())
	if n.clock == nil {
		n.clock = supervision.NewJumpClock(nil) // the node's machine clock: it outlives a kill
	}
	full, fsRoot := newFullFS(rs.disk, chaosBlockBytes), filepath.Join(e.dir, dir, "fs")
	cfg := singleConfig()
	cfg.Clock = n.clock
	cfg.SecondaryTiers = []kvtier.TierConfig{
		{Kind: tiers.KindFS, Root: fsRoot, Capacity: kvtier.ByteSize(chaosFSBlocks * chaosBlockBytes),
			Layout: rs.opts.FSLayout, FS: chaosFS(rs.gate, full)},
		{Kind: tiers.KindObj, Endpoint: e.s3.Endpoint, Bucket: bucket, AccessKey: objtest.AccessKey,
			SecretKey: objtest.SecretKey, ObjClient: chaosObjClient(rs.gate, s3)},
	}
	cfg.Faults, cfg.Logger = inj, rs.opts.Log
	if tweak != nil {
		tweak(&cfg)
	}
	node, err := kvtier.Open(ctx, cfg)
	if err != nil {
		inj.Close()
		return fmt.Errorf("open node %s: %w", name, err)
	}
	n.node, n.mgr, n.inj = node, node.Manager(), inj
	n.disk, n.fsRoot = full, fsRoot
	n.take = newResidency()
	n.pub = subscribe(node.EventsEndpoint(), node.EventsReplayEndpoint())
	return nil
}

// makeBucket creates bucket, retrying while the S3 server is down — an
// obj-outage fault may be under way when a peer-kill reopens a node, and it
// lasts seconds — until ctx ends.
func makeBucket(ctx context.Context, s3 *objtest.Server, bucket string) error {
	wait := 50 * time.Millisecond
	for {
		err := s3.MakeBucket(ctx, bucket)
		if err == nil {
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last try: %w)", ctx.Err(), err)
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}
