package discovery

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/internal/testutil/testetcd"
	"github.com/kvtier/kvtier/internal/testutil/testloop"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testTTL is the lease of these tests: etcd's shortest.
const testTTL = 2 * time.Second

// bound is how long any wait here may take: a liveness bound for a loaded
// machine, never a timing.
const bound = 30 * time.Second

// recorder is a subscriber that keeps every event.
type recorder struct {
	mu     sync.Mutex
	evs    []Event
	notify chan struct{}
}

func newRecorder() *recorder { return &recorder{notify: make(chan struct{}, 1)} }

func (r *recorder) add(ev Event) {
	r.mu.Lock()
	r.evs = append(r.evs, ev)
	r.mu.Unlock()
	signal(r.notify)
}

func (r *recorder) events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.evs...)
}

// members is the membership the events add up to.
func (r *recorder) members() map[string]Member {
	out := map[string]Member{}
	for _, ev := range r.events() {
		if ev.Kind == Joined {
			out[ev.Member.Node] = ev.Member
		} else {
			delete(out, ev.Member.Node)
		}
	}
	return out
}

// await waits until cond holds for the events so far.
func (r *recorder) await(t *testing.T, what string, cond func(evs []Event) bool) {
	t.Helper()
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	for !cond(r.events()) {
		select {
		case <-r.notify:
		case <-deadline.C:
			t.Fatalf("%s: not after %v; events: %v", what, bound, kinds(r.events()))
		}
	}
}

func (r *recorder) awaitMembers(t *testing.T, nodes ...string) {
	t.Helper()
	r.await(t, fmt.Sprintf("members %v", nodes), func([]Event) bool {
		m := r.members()
		if len(m) != len(nodes) {
			return false
		}
		for _, n := range nodes {
			if _, ok := m[n]; !ok {
				return false
			}
		}
		return true
	})
}

func hasLeft(evs []Event, node string) bool {
	for _, ev := range evs {
		if ev.Kind == Left && ev.Member.Node == node {
			return true
		}
	}
	return false
}

func testLog(t *testing.T) zerolog.Logger {
	if os.Getenv("KVTIER_TEST_LOG") != "" {
		return zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger()
	}
	return zerolog.Nop()
}

// start registers node against etcd, closed (gracefully) when the test
// ends, with a recorder subscribed.
func start(t *testing.T, s *testetcd.Server, node string) (*Registry, *recorder) {
	t.Helper()
	r, err := Start(context.Background(), nodeConfig(t, s, node))
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	rec := newRecorder()
	r.Subscribe(rec.add)
	return r, rec
}

func nodeConfig(t *testing.T, s *testetcd.Server, node string) Config {
	return Config{Endpoints: []string{s.Endpoint()}, TTL: testTTL, RetryMin: 20 * time.Millisecond,
		Self: Member{Node: node, Control: "tcp://127.0.0.1:7" + node, Transport: "tcp", BlockBytes: 4096, Slots: 8, Protocol: 2},
		Log:  testLog(t).With().Str("node", node).Logger()}
}

// startEtcd runs the test's etcd, with a plain client of it.
func startEtcd(t *testing.T) (*testetcd.Server, *clientv3.Client) {
	t.Helper()
	s := testetcd.Start(t)
	return s, raw(t, s)
}

// startPair registers nodes a and b and waits until each sees the other.
func startPair(t *testing.T, s *testetcd.Server) (a *Registry, recA *recorder, b *Registry, recB *recorder) {
	t.Helper()
	a, recA = start(t, s, "a")
	b, recB = start(t, s, "b")
	recA.awaitMembers(t, "b")
	recB.awaitMembers(t, "a")
	return a, recA, b, recB
}

// crash ends a registry as a killed process would: no delete, no revoke;
// its lease is left to expire.
func crash(r *Registry) {
	r.closeOnce.Do(func() {
		r.cancel()
		r.wg.Wait()
		r.Subscribe(nil)
		r.closeErr = r.cli.Close()
	})
}

// raw is a plain client of the test's etcd, to look behind the registry.
func raw(t *testing.T, s *testetcd.Server) *clientv3.Client { return s.Client(t) }

// held returns the record and lease under node's key (ok false: no key).
func held(t *testing.T, cli *clientv3.Client, node string) (Member, int64, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	resp, err := cli.Get(ctx, nodeKey(DefaultPrefix, node))
	require.NoError(t, err)
	if len(resp.Kvs) == 0 {
		return Member{}, 0, false
	}
	m, err := decode(node, resp.Kvs[0].Value)
	require.NoError(t, err)
	return m, resp.Kvs[0].Lease, true
}

// poll waits until cond holds: for state that has no event to wait on (a
// process's registration in etcd).
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testloop.Poll(t, what, bound, cond)
}

func TestRegisterWatchJoinAndGracefulLeave(t *testing.T) {
	s := testetcd.Start(t)
	cli := raw(t, s)
	a, recA := start(t, s, "a")
	got, lease, ok := held(t, cli, "a")
	require.True(t, ok, "Start returns once registered")
	require.NotZero(t, lease, "under a lease")
	require.Equal(t, a.Self(), got, "the record is what the node said")
	require.Equal(t, "tcp://127.0.0.1:7a", got.Control)
	require.NotEmpty(t, got.Instance)
	require.False(t, got.Started.IsZero())

	b, recB := start(t, s, "b")
	recA.awaitMembers(t, "b")
	recB.awaitMembers(t, "a")
	poll(t, "both up", func() bool { return a.Up() && b.Up() })
	require.Equal(t, 1, a.Members(), "a knows b, not itself")

	replay := newRecorder()
	a.Subscribe(replay.add)
	require.Equal(t, []string{"joined b"}, kinds(replay.events()), "a new subscriber hears every member at once")

	require.NoError(t, b.Close(context.Background()))
	_, _, ok = held(t, cli, "b")
	require.False(t, ok, "a graceful close deletes the key before it returns")
	replay.awaitMembers(t)
	require.True(t, hasLeft(replay.events(), "b"))
	require.NotEmpty(t, recB.events())
}

func TestDuplicateNodeIDRefused(t *testing.T) {
	s := testetcd.Start(t)
	cli := raw(t, s)
	a, _ := start(t, s, "a")
	before, lease, _ := held(t, cli, "a")

	_, err := Start(context.Background(), nodeConfig(t, s, "a"))
	require.ErrorIs(t, err, ErrDuplicateNode)
	require.Contains(t, err.Error(), "tcp://127.0.0.1:7a", "the error names the live holder")
	after, leaseAfter, ok := held(t, cli, "a")
	require.True(t, ok)
	require.Equal(t, before, after, "the live node keeps its key")
	require.Equal(t, lease, leaseAfter)
	require.NoError(t, a.Close(context.Background()))
}

// A node that dies without closing (SIGKILL) leaves the others' view when
// its lease expires.
func TestLeaseExpiryRemovesAMember(t *testing.T) {
	s := testetcd.Start(t)
	cli := raw(t, s)
	_, recA := start(t, s, "a")
	b, _ := start(t, s, "b")
	recA.awaitMembers(t, "b")

	crash(b)
	_, _, ok := held(t, cli, "b")
	require.True(t, ok, "a crash deletes nothing: the lease must lapse")
	recA.awaitMembers(t)
	require.True(t, hasLeft(recA.events(), "b"))
	_, _, ok = held(t, cli, "b")
	require.False(t, ok, "the key went with its lease")
}

// etcd down at start: the node starts anyway, and registers once etcd
// answers.
func TestStartWithEtcdDownRegistersLater(t *testing.T) {
	s := testetcd.New(t) // ports picked, not started
	a, recA := start(t, s, "a")
	require.False(t, a.Up())
	require.NoError(t, s.Start(context.Background()))
	cli := raw(t, s)
	poll(t, "a registered", func() bool { _, _, ok := held(t, cli, "a"); return ok && a.Up() })
	_, _ = start(t, s, "b")
	recA.awaitMembers(t, "b")
}

// etcd killed and restarted on its data: nobody is reported Left while it
// is down; afterwards every node registers again under a new lease (its
// old key taken over, not refused as a duplicate) and the views converge,
// a node that joined meanwhile included.
func TestEtcdRestartReregistersAndConverges(t *testing.T) {
	s, cli := startEtcd(t)
	a, recA, b, recB := startPair(t, s)
	_, leaseA, _ := held(t, cli, "a")

	s.Kill()
	poll(t, "etcd seen down", func() bool { return !a.Up() && !b.Up() })
	poll(t, "leases given up", func() bool { return a.lease.Load() == 0 && b.lease.Load() == 0 })
	require.Equal(t, 1, a.Members(), "etcd down is not a member down")

	require.NoError(t, s.Restart(context.Background()))
	poll(t, "both up again", func() bool { return a.Up() && b.Up() })
	_, leaseA2, ok := held(t, cli, "a")
	require.True(t, ok)
	require.NotEqual(t, leaseA, leaseA2, "registered again under a new lease")
	_, _ = start(t, s, "c")
	recA.awaitMembers(t, "b", "c")
	recB.awaitMembers(t, "a", "c")
	require.False(t, hasLeft(recA.events(), "b"), "b never left a's view: %v", kinds(recA.events()))
	require.False(t, hasLeft(recB.events(), "a"), "a never left b's view: %v", kinds(recB.events()))
}

// Our own key deleted behind our back (an operator's etcdctl del) is put
// back.
func TestOwnKeyDeletedIsRegisteredAgain(t *testing.T) {
	s := testetcd.Start(t)
	cli := raw(t, s)
	a, _ := start(t, s, "a")
	poll(t, "a up", a.Up)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	_, err := cli.Delete(ctx, nodeKey(DefaultPrefix, "a"))
	require.NoError(t, err)
	poll(t, "a registered again", func() bool { _, _, ok := held(t, cli, "a"); return ok })
}

// etcd replaced by an empty one on the same address (restored from
// nothing, revisions starting over): every node notices its lease is gone,
// registers again and lists afresh — a watch resumed at the old revision
// would wait for revisions the new etcd has not reached.
func TestEtcdWipedReregistersAndConverges(t *testing.T) {
	s, cli := startEtcd(t)
	a, recA, b, recB := startPair(t, s)
	poll(t, "both up", func() bool { return a.Up() && b.Up() })

	require.NoError(t, s.Wipe(context.Background()))
	poll(t, "both registered in the new etcd", func() bool {
		_, _, okA := held(t, cli, "a")
		_, _, okB := held(t, cli, "b")
		return okA && okB
	})
	_, _ = start(t, s, "c")
	recA.awaitMembers(t, "b", "c")
	recB.awaitMembers(t, "a", "c")
	poll(t, "both up again", func() bool { return a.Up() && b.Up() })
}
