package bench

// The one protocol between a benchmark and its child processes (the idle
// scenario's nodes, peers and engine, idlechild.go; the P2P scenarios' node
// processes, p2pnode.go). A child announces itself with one reply line on
// stdout, then answers each request line read from stdin with one reply
// line, in order, until a quit request or the end of stdin. Lines are JSON.
//
// Requests are typed: each protocol is a sealed set of request structs (each
// embeds request[P], P a type naming the protocol, so it is a requestOf[P];
// and the list newRequestTypes makes of them), sent by their Go type name
// and decoded into that type, so a child's handler is a type switch. The reply is one
// struct type R per protocol, its fields filled by request; a handler's
// error travels beside it.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"reflect"
	"time"

	"github.com/kvtier/kvtier/internal/proc"
)

// request marks a struct as a request of the protocol P (embedded in each).
type request[P any] struct{}

func (request[P]) requestOf(P) {}

// requestOf is the interface every request of the protocol P satisfies.
type requestOf[P any] interface{ requestOf(P) }

// requestLine is a request on the wire: Type names one of the protocol's
// request types and Body is its value; Quit ends the child.
type requestLine struct {
	Type string          `json:"type,omitempty"`
	Body json.RawMessage `json:"body,omitempty"`
	Quit bool            `json:"quit,omitempty"`
}

// replyLine is a reply on the wire (the announcement included).
type replyLine[R any] struct {
	Err   string `json:"err,omitempty"`
	Reply R      `json:"reply"`
}

// requestTypes is a protocol's sealed set of request types, by name.
type requestTypes[Q any] map[string]reflect.Type

// newRequestTypes lists a protocol's request types (one zero value each).
func newRequestTypes[Q any](reqs ...Q) requestTypes[Q] {
	ts := make(requestTypes[Q], len(reqs))
	for _, q := range reqs {
		t := reflect.TypeOf(q)
		ts[t.Name()] = t
	}
	return ts
}

func (ts requestTypes[Q]) encode(q Q) (requestLine, error) {
	t := reflect.TypeOf(q)
	if ts[t.Name()] != t {
		return requestLine{}, fmt.Errorf("bench child: %v is not a request of this protocol", t)
	}
	body, err := json.Marshal(q)
	return requestLine{Type: t.Name(), Body: body}, err
}

func (ts requestTypes[Q]) decode(l requestLine) (Q, error) {
	var q Q
	t, ok := ts[l.Type]
	if !ok {
		return q, fmt.Errorf("unknown request %q", l.Type)
	}
	v := reflect.New(t)
	if err := json.Unmarshal(l.Body, v.Interface()); err != nil {
		return q, fmt.Errorf("request %s: %w", l.Type, err)
	}
	return v.Elem().Interface().(Q), nil
}

// --- the child's side -----------------------------------------------------------

// announce writes the child's first line: it is up, and what it has to say.
func announce[R any](stdout io.Writer, ready R) error {
	return json.NewEncoder(stdout).Encode(replyLine[R]{Reply: ready})
}

// serveChild announces ready, then answers each request with handle until
// a quit request (answered with a zero reply) or the end of stdin. A line
// that is not a request ends it with an error.
func serveChild[Q, R any](stdin io.Reader, stdout io.Writer, ts requestTypes[Q], ready R, handle func(Q) (R, error)) error {
	if err := announce(stdout, ready); err != nil {
		return err
	}
	enc, dec := json.NewEncoder(stdout), json.NewDecoder(stdin)
	for {
		var l requestLine
		if err := dec.Decode(&l); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("bad request line: %w", err)
		}
		if l.Quit {
			return enc.Encode(replyLine[R]{})
		}
		var out replyLine[R]
		q, err := ts.decode(l)
		if err == nil {
			out.Reply, err = handle(q)
		}
		if err != nil {
			out = replyLine[R]{Err: err.Error()}
		}
		if err := enc.Encode(out); err != nil {
			return err
		}
	}
}

// --- the benchmark's side ----------------------------------------------------------

// childProc is a running child process speaking protocol (Q, R).
type childProc[Q, R any] struct {
	name  string
	types requestTypes[Q]
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *json.Decoder
	ready R // what the child announced
}

// startChild starts cmd (it dies with this process) and reads its
// announcement. Its stderr is this process's.
func startChild[Q, R any](name string, ts requestTypes[Q], cmd *exec.Cmd) (*childProc[Q, R], error) {
	cmd.Stderr = os.Stderr
	cmd.WaitDelay = 5 * time.Second
	proc.DieWithParent(cmd)
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &childProc[Q, R]{name: name, types: ts, cmd: cmd, in: in, out: json.NewDecoder(bufio.NewReader(out))}
	r, err := c.recv()
	if err != nil {
		c.kill()
		return nil, fmt.Errorf("%s did not start: %w", name, err)
	}
	c.ready = r
	return c, nil
}

func (c *childProc[Q, R]) pid() int { return c.cmd.Process.Pid }

// send writes a request without waiting for its reply (recv reads it), so
// the benchmark can have two children working at once.
func (c *childProc[Q, R]) send(q Q) error {
	l, err := c.types.encode(q)
	if err != nil {
		return err
	}
	return c.write(l)
}

func (c *childProc[Q, R]) write(l requestLine) error {
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	_, err = c.in.Write(append(b, '\n'))
	return err
}

// recv reads the next reply; the child's error is returned as an error.
func (c *childProc[Q, R]) recv() (R, error) {
	var l replyLine[R]
	if err := c.out.Decode(&l); err != nil {
		return l.Reply, fmt.Errorf("%s (pid %d): %w", c.name, c.pid(), err)
	}
	if l.Err != "" {
		return l.Reply, fmt.Errorf("%s (pid %d): %s", c.name, c.pid(), l.Err)
	}
	return l.Reply, nil
}

// call sends a request and reads its reply.
func (c *childProc[Q, R]) call(q Q) (R, error) {
	if err := c.send(q); err != nil {
		var zero R
		return zero, err
	}
	return c.recv()
}

// quit asks the child to close what it runs and exit, and waits for it;
// kills it if it has not exited within 15 s.
func (c *childProc[Q, R]) quit() {
	if c.write(requestLine{Quit: true}) == nil {
		_, _ = c.recv()
	}
	_ = c.in.Close()
	c.wait(15 * time.Second)
}

// kill kills the child and waits for it.
func (c *childProc[Q, R]) kill() {
	_ = c.cmd.Process.Kill()
	c.wait(15 * time.Second)
}

func (c *childProc[Q, R]) wait(d time.Duration) {
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			fmt.Fprintf(os.Stderr, "bench: %s: %v\n", c.name, err)
		}
	case <-t.C:
		_ = c.cmd.Process.Kill()
		<-done
	}
}
