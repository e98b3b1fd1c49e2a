// Package testetcd runs a real etcd server for tests: Debian's etcd-server
// package (etcd 3.4, /usr/bin/etcd; scripts/test.sh installs it), one member
// on loopback, its data in a directory of the test's. It owns the server
// process: Start starts it and returns once it answers /health, Kill and
// Restart stop and start it over the same data behind the same endpoint
// (an etcd that dies and comes back), Wipe restarts it with no data, Stop
// ends it. Start and New serve tests; Launch serves benchmarks (no
// testing.T). The process dies with the test binary (parent-death signal)
// and in its own process group, so nothing outlives a crashed test.
//
// The endpoint is a front this process holds for the Server's life
// (internal/testutil/front): etcd itself listens on client and peer ports
// picked free at each start, so a restart never races another process for
// a port it just freed, and while etcd is down the endpoint refuses
// connections as a dead etcd's would.
package testetcd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kvtier/kvtier/internal/proc"
	"github.com/kvtier/kvtier/internal/testutil/freeport"
	"github.com/kvtier/kvtier/internal/testutil/front"
	"github.com/kvtier/kvtier/internal/testutil/needbin"
)

// TB is the part of testing.TB these helpers use: needbin's, and the
// test's log and verdict (a failed test shows etcd's output).
type TB interface {
	needbin.TB
	Logf(format string, args ...any)
	Failed() bool
}

// Install is how to get the server binary.
const Install = "apt-get install -y --no-install-recommends etcd-server"

// readyTimeout bounds the wait for a started server to answer.
const readyTimeout = 30 * time.Second

// ErrNotFound: no etcd binary on PATH or in /usr/bin.
var ErrNotFound = errors.New("testetcd: etcd not found on PATH or in /usr/bin (" + Install + ")")

// Binary finds etcd: on PATH, else /usr/bin/etcd (Debian's package).
func Binary() (string, error) {
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	if st, err := os.Stat("/usr/bin/etcd"); err == nil && st.Mode()&0o111 != 0 {
		return "/usr/bin/etcd", nil
	}
	return "", ErrNotFound
}

// Need returns the etcd binary. Without it the test is skipped, or fails
// when CI is "true": CI must run these tests (needbin.Need).
func Need(t TB) string {
	t.Helper()
	return needbin.Need(t, Binary)
}

// Start launches a server over a temporary data directory, stopped when
// the test ends. Without the binary the test is skipped, or fails when CI
// is "true" (Need).
func Start(t TB) *Server {
	t.Helper()
	s := New(t)
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// New holds the server's endpoint and picks its data directory without
// starting it (a test of a node that starts before etcd does: its
// connections are refused); Start starts it. It is stopped when the test
// ends.
func New(t TB) *Server {
	t.Helper()
	s, err := newServer(Need(t), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("etcd output:\n%s", s.Output())
		}
	})
	return s
}

// Launch starts a server outside a test (a benchmark's): bin, or Binary
// when empty, over a temporary data directory that Stop removes.
func Launch(ctx context.Context, bin string) (*Server, error) {
	if bin == "" {
		var err error
		if bin, err = Binary(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "kvtier-etcd-")
	if err != nil {
		return nil, fmt.Errorf("testetcd: %w", err)
	}
	s, err := newServer(bin, dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s.ownsDir = true
	if err := s.Start(ctx); err != nil {
		s.Stop() // the front's port, and dir
		return nil, err
	}
	return s, nil
}

func newServer(bin, dir string) (*Server, error) {
	f, err := front.New()
	if err != nil {
		return nil, fmt.Errorf("testetcd: %w", err)
	}
	return &Server{endpoint: "http://" + f.Addr(), front: f, bin: bin, dir: dir}, nil
}

// Server is a running (or stopped) etcd.
type Server struct {
	endpoint string // the front's: what clients see, whichever ports etcd has now
	front    *front.Front
	bin      string
	dir      string
	ownsDir  bool // Launch made dir: Stop removes it

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	out  *proc.Output
}

// Endpoint is the client URL, http://127.0.0.1:port: the front's, the
// same for the Server's life.
func (s *Server) Endpoint() string { return s.endpoint }

// Start runs the process (again: same endpoint, same data, new ports of
// its own) and waits until it answers.
func (s *Server) Start(ctx context.Context) error {
	s.Kill()
	var err error
	for range 3 { // NB: the ports are free when picked; another process may bind one first
		if err = s.start(ctx); !errors.Is(err, errPortTaken) {
			return err
		}
	}
	return err
}

// errPortTaken: etcd could not bind a port picked for it.
var errPortTaken = errors.New("testetcd: a port picked free was taken")

// start runs the process on fresh ports behind the front and waits for
// readiness through it.
func (s *Server) start(ctx context.Context) error {
	ports, err := freeport.Ports(2)
	if err != nil {
		return err
	}
	client := freeport.Loopback(ports[0])
	peerURL := "http://" + freeport.Loopback(ports[1])
	// NB: an existing data directory restarts the same member; the
	// initial-cluster flags are ignored then, and the peer URL the member
	// recorded at first start goes stale. One member never dials a peer, so
	// etcd 3.4 restarts fine on a new peer port (TestClientV37AgainstServer).
	cmd := exec.Command(s.bin,
		"--name", "test", "--data-dir", s.dir+"/data",
		"--listen-client-urls", "http://"+client, "--advertise-client-urls", s.endpoint,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "test="+peerURL, "--initial-cluster-state", "new",
		"--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn")
	out := &proc.Output{}
	cmd.Stdout, cmd.Stderr = out, out
	proc.DieWithParent(cmd) // a test binary that dies leaves no etcd behind
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testetcd: start %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done, s.out = cmd, done, out
	s.mu.Unlock()
	if err := s.front.Serve(client); err != nil {
		s.Kill()
		return fmt.Errorf("testetcd: %w", err)
	}
	if err := waitReady(ctx, s.endpoint, done); err != nil {
		s.Kill()
		if strings.Contains(out.String(), "address already in use") {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return fmt.Errorf("%w; etcd output:\n%s", err, out.String())
	}
	return nil
}

// waitReady asks /health with a growing pause until etcd says it is
// healthy (it has a leader), the process exits, or readyTimeout passes.
func waitReady(ctx context.Context, endpoint string, exited <-chan struct{}) error {
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	return proc.AwaitReady(ctx, "testetcd: etcd at "+endpoint, readyTimeout, exited, func(ctx context.Context) error {
		return health(ctx, client, endpoint)
	})
}

func health(ctx context.Context, client *http.Client, endpoint string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"health":"true"`) {
		return fmt.Errorf("testetcd: /health: %d %s", resp.StatusCode, bytes.TrimSpace(body))
	}
	return nil
}

// Kill ends the process at once (SIGKILL to its group) and waits for it;
// its data stays for Restart. The front first closes what it relayed and
// refuses new connections, as a dead etcd's port would. A no-op when it is
// not running.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	s.front.Down()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// Restart kills the server and starts it again over the same data, behind
// the same endpoint.
func (s *Server) Restart(ctx context.Context) error { return s.Start(ctx) }

// Wipe kills the server and starts a new one behind the same endpoint with
// no data: an etcd restored from nothing (revisions and leases start over).
func (s *Server) Wipe(ctx context.Context) error {
	s.Kill()
	if err := os.RemoveAll(s.dir + "/data"); err != nil {
		return fmt.Errorf("testetcd: wipe: %w", err)
	}
	return s.Start(ctx)
}

// Stop ends the process and the front (and removes the data Launch made).
func (s *Server) Stop() {
	s.Kill()
	s.front.Close()
	if s.ownsDir {
		_ = os.RemoveAll(s.dir)
	}
}

// Output is what the server printed.
func (s *Server) Output() string {
	s.mu.Lock()
	out := s.out
	s.mu.Unlock()
	if out == nil {
		return ""
	}
	return out.String()
}

// Client is a plain client of the server, closed when the test ends: to
// look behind the code under test.
func (s *Server) Client(t TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Lapse revokes the lease key is held under, as the lease lapsing would
// (the key goes with it), and returns the lease; the test fails if key is
// not held under one.
func (s *Server) Lapse(t TB, key string) clientv3.LeaseID {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	cli := s.Client(t)
	resp, err := cli.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("etcd: %s is not held under a lease (%v)", key, err)
	}
	lease := clientv3.LeaseID(resp.Kvs[0].Lease)
	if _, err := cli.Revoke(ctx, lease); err != nil {
		t.Fatalf("etcd: revoke %s's lease: %v", key, err)
	}
	return lease
}
