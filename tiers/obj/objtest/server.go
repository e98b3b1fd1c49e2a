// Package objtest runs a real S3-compatible server for tests and
// benchmarks: versitygw (Apache-2.0) with its posix backend in a directory,
// listening on 127.0.0.1 only. It owns the server process: Launch starts it
// and returns once it answers a real S3 request, Kill and Restart stop and
// start it over the same directory behind the same endpoint (one that dies
// and comes back), Stop ends it.
//
// The endpoint Launch gives is a front this process holds
// (internal/testutil/front): the server behind it listens on a port of its
// own, a new one at each restart, so a restart never races another process
// for the port it just freed.
// LaunchDirect serves benchmarks without the front (and cannot restart).
package objtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/kvtier/kvtier/internal/proc"
	"github.com/kvtier/kvtier/internal/testutil/freeport"
	"github.com/kvtier/kvtier/internal/testutil/front"
	"github.com/kvtier/kvtier/tiers/obj"
)

// Install is how to get the server binary.
const Install = "go install github.com/versity/versitygw/cmd/versitygw@v1.8.0"

// Credentials of the server's root account.
const (
	AccessKey = "kvtier-test"
	SecretKey = "kvtier-test-secret"
)

// readyTimeout bounds the wait for a started server to answer.
const readyTimeout = 20 * time.Second

// Binary finds versitygw: on PATH, else in $(go env GOPATH)/bin.
func Binary() (string, error) {
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
			gopath = strings.TrimSpace(string(out))
		}
	}
	for _, dir := range filepath.SplitList(gopath) {
		p := filepath.Join(dir, "bin", "versitygw")
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("versitygw not found on PATH or in $(go env GOPATH)/bin (%s)", Install)
}

// Server is a running (or killed) versitygw.
type Server struct {
	Endpoint string // 127.0.0.1:port: the front's, or the server's own (LaunchDirect)
	Dir      string // the posix backend's root: one directory per bucket

	bin   string
	front *front.Front // nil: direct
	mu    sync.Mutex
	cmd   *exec.Cmd
	done  chan struct{}
	log   *os.File // what the server printed, every run (a file: exec then starts no copying goroutine)
}

// Launch starts versitygw over dir behind a front on a free loopback port
// and waits until it answers.
func Launch(ctx context.Context, bin, dir string) (*Server, error) {
	f, err := front.New()
	if err != nil {
		return nil, err
	}
	s := &Server{Endpoint: f.Addr(), Dir: dir, bin: bin, front: f}
	if err := s.startOnFreePort(ctx); err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

// LaunchDirect starts versitygw over dir on a free loopback port, with no
// front (a benchmark measures the server, not a relay); it cannot Restart.
func LaunchDirect(ctx context.Context, bin, dir string) (*Server, error) {
	s := &Server{Dir: dir, bin: bin}
	if err := s.startOnFreePort(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// startOnFreePort starts the server on a port picked free, trying again on
// another if it could not have it.
func (s *Server) startOnFreePort(ctx context.Context) error {
	var last error
	for range 3 { // NB: the port is free when picked; another process may take it first
		port, err := freeport.Port()
		if err != nil {
			return err
		}
		if last = s.start(ctx, net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); last == nil {
			return nil
		}
	}
	return last
}

// start runs the process on addr and waits for readiness through the
// endpoint.
func (s *Server) start(ctx context.Context, addr string) error {
	cmd := exec.Command(s.bin, "--port", addr, "--access", AccessKey, "--secret", SecretKey,
		"--quiet", "posix", s.Dir)
	if s.log == nil {
		f, err := os.CreateTemp("", "kvtier-versitygw-*.log")
		if err != nil {
			return fmt.Errorf("objtest: server log: %w", err)
		}
		s.log = f
	}
	cmd.Stdout, cmd.Stderr = s.log, s.log
	proc.DieWithParent(cmd) // a harness that dies leaves no S3 server behind
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("objtest: start %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	if s.front == nil {
		s.Endpoint = addr
	}
	s.mu.Unlock()
	if s.front != nil {
		if err := s.front.Serve(addr); err != nil {
			s.Kill()
			return err
		}
	}
	if err := s.waitReady(ctx, done); err != nil {
		s.Kill()
		return fmt.Errorf("%w; server output: %s", err, s.Output())
	}
	return nil
}

// waitReady retries a real S3 request (ListBuckets) with a growing pause
// until it succeeds, the process exits, or readyTimeout passes.
func (s *Server) waitReady(ctx context.Context, exited <-chan struct{}) error {
	c, err := s.Client()
	if err != nil {
		return err
	}
	defer c.Close()
	return proc.AwaitReady(ctx, "objtest: versitygw at "+s.Endpoint, readyTimeout, exited, func(ctx context.Context) error {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := c.Raw().ListBuckets(rctx)
		return err
	})
}

// Client is a minio-go client of the server for bucket (close it).
func (s *Server) Client(bucket ...string) (*obj.Minio, error) {
	ep := obj.Endpoint{Endpoint: s.Endpoint, AccessKey: AccessKey, SecretKey: SecretKey}
	if len(bucket) > 0 {
		ep.Bucket = bucket[0]
	}
	return obj.NewMinio(ep)
}

// MakeBucket creates a bucket.
func (s *Server) MakeBucket(ctx context.Context, name string) error {
	c, err := s.Client()
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.Raw().MakeBucket(ctx, name, minio.MakeBucketOptions{}); err != nil {
		return fmt.Errorf("objtest: make bucket %s: %w", name, err)
	}
	return nil
}

// Kill ends the process at once (SIGKILL) and waits for it; the front
// then closes what it relayed and refuses new connections, as a dead
// server's port would.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if s.front != nil {
		s.front.Down()
	}
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Restart starts the server again over the same directory, behind the same
// endpoint.
func (s *Server) Restart(ctx context.Context) error {
	if s.front == nil {
		return fmt.Errorf("objtest: a direct server cannot restart behind its endpoint")
	}
	s.Kill()
	return s.startOnFreePort(ctx)
}

// Stop ends the process and the front.
func (s *Server) Stop() {
	s.Kill()
	if s.front != nil {
		s.front.Close()
	}
	if s.log != nil {
		_ = s.log.Close()
		_ = os.Remove(s.log.Name())
	}
}

// Output is what the server printed, every run.
func (s *Server) Output() string {
	if s.log == nil {
		return ""
	}
	b, _ := os.ReadFile(s.log.Name())
	return string(b)
}
