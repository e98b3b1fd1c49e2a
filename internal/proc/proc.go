// Package proc ties the processes kvtier's harnesses start (the S3 test
// server, etcd, benchmark and chaos children) to the process that started them,
// so none outlives it: not on a panic, not on a SIGKILL of the harness. It
// owns no state. AwaitReady waits for such a server to answer.
package proc

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// DieWithParent makes cmd's process receive SIGKILL when the starting
// process dies (Linux's parent-death signal). Call it before cmd.Start.
//
// NB: the signal follows the OS thread that forks, and the Go runtime keeps
// its threads for the life of the process (nothing here locks one), so in
// practice it fires when the harness process ends.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}

// AwaitReady calls probe with a growing pause (from 2 ms to 100 ms) until
// it succeeds, the process (exited closes when it ends) exits, or timeout
// passes. what names the server in the error, which wraps probe's last.
func AwaitReady(ctx context.Context, what string, timeout time.Duration, exited <-chan struct{}, probe func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	wait := 2 * time.Millisecond
	for {
		err := probe(ctx)
		if err == nil {
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-exited:
			t.Stop()
			return fmt.Errorf("%s exited before answering: %w", what, err)
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s not ready: %w (last: %w)", what, ctx.Err(), err)
		case <-t.C:
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// Output is a child process's stdout and stderr in one buffer, written by
// exec's copying goroutine and read meanwhile: set it as both cmd.Stdout
// and cmd.Stderr (one writer, so exec copies both on one goroutine).
type Output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

// String is what the process printed so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}
