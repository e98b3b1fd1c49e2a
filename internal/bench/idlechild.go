package bench

// The child processes of `kvtier bench idle` (idle.go): a peer node that
// dials the measured node and, when told, fetches from it continuously;
// and the baseline, a process that only sleeps. They speak JSON lines:
// one idleReply when ready, then one idleReply per idleCmd on stdin.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/messages"
)

// idleCmd is one command to a peer child.
type idleCmd struct {
	Op string `json:"op"` // fetch: start fetching continuously; mark: report counts; quit
}

// idleReply answers a command (and announces readiness).
type idleReply struct {
	OK         bool   `json:"ok"`
	Err        string `json:"err,omitempty"`
	Pid        int    `json:"pid"`
	Goroutines int    `json:"goroutines"`
	PeerAddr   string `json:"peer_addr,omitempty"`
	Rounds     int64  `json:"rounds"`  // fetch rounds fetched and verified
	Missed     int64  `json:"missed"`  // rounds that found no peer copy
	Failures   int64  `json:"failure"` // rounds that failed with an error
}

// IdleChildMain runs one child of the idle scenario: args are the role
// ("node" or "sleep") and its flags. It returns the process exit status.
func IdleChildMain(args []string, stdin io.Reader, stdout io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "bench idle child: want a role: node or sleep")
		return 2
	}
	switch args[0] {
	case "sleep":
		// The baseline: a Go program that only sleeps.
		_ = json.NewEncoder(stdout).Encode(idleReply{OK: true, Pid: os.Getpid(), Goroutines: runtime.NumGoroutine()})
		time.Sleep(365 * 24 * time.Hour)
		return 0
	case "node":
		if err := runIdlePeer(args[1:], stdin, stdout); err != nil {
			fmt.Fprintln(os.Stderr, "bench idle peer:", err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "bench idle child: unknown role %q\n", args[0])
	return 2
}

type idlePeerFlags struct {
	id, listen, secret, peer  string
	blockBytes, slots, blocks int
	heartbeat                 time.Duration
}

func parseIdlePeer(args []string) (idlePeerFlags, error) {
	var f idlePeerFlags
	fs := flag.NewFlagSet("bench idle node", flag.ContinueOnError)
	fs.StringVar(&f.id, "id", "", "node id")
	fs.StringVar(&f.listen, "listen", "", "control-plane address")
	fs.StringVar(&f.secret, "secret", "", "shared secret")
	fs.StringVar(&f.peer, "peer", "", "the measured node: id=tcp://host:port")
	fs.IntVar(&f.blockBytes, "block-bytes", 0, "bytes per block")
	fs.IntVar(&f.slots, "slots", 0, "pool slots")
	fs.IntVar(&f.blocks, "blocks", 0, "blocks fetched per round")
	fs.DurationVar(&f.heartbeat, "heartbeat", 0, "peer heartbeat period (0: default; negative: off)")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if f.id == "" || f.listen == "" || f.peer == "" || f.blockBytes <= 0 || f.slots < f.blocks || f.blocks <= 0 {
		return f, fmt.Errorf("%w: bench idle node: --id, --listen, --peer, --block-bytes, --slots ≥ --blocks > 0 required", messages.ErrBadConfig)
	}
	return f, nil
}

func runIdlePeer(args []string, stdin io.Reader, stdout io.Writer) error {
	f, err := parseIdlePeer(args)
	if err != nil {
		return err
	}
	target, addr, ok := strings.Cut(f.peer, "=")
	if !ok {
		return fmt.Errorf("%w: --peer %q: want id=tcp://host:port", messages.ErrBadConfig, f.peer)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	node, err := kvtier.Open(ctx, kvtier.Config{PoolBytes: int64(f.slots) * int64(f.blockBytes), BlockBytes: f.blockBytes,
		Peers: kvtier.PeersConfig{NodeID: f.id, Listen: f.listen, Secret: f.secret,
			Static: []kvtier.PeerAddr{{NodeID: target, Addr: addr}}, HeartbeatInterval: f.heartbeat}})
	if err != nil {
		return err
	}
	p := &idlePeer{node: node, m: node.Manager(), keys: keyRange(0, f.blocks), stop: make(chan struct{}), done: make(chan struct{})}
	defer p.close()
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	err = node.WaitPeers(wctx, target)
	wcancel()
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	if err := enc.Encode(p.reply(node.PeerAddr())); err != nil {
		return err
	}
	dec := json.NewDecoder(stdin)
	for {
		var c idleCmd
		if err := dec.Decode(&c); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		r := p.reply("")
		switch c.Op {
		case "fetch":
			r = p.startFetching()
		case "mark":
		case "quit":
			p.close()
			return enc.Encode(p.reply(""))
		default:
			r = idleReply{Err: "unknown op " + c.Op}
		}
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
}

// idlePeer is a peer node that fetches from the measured node on demand.
type idlePeer struct {
	node                     *kvtier.Node
	m                        kvtier.Manager
	keys                     []messages.Key
	rounds, missed, failures atomic.Int64
	started                  bool
	first                    chan struct{}
	stop, done               chan struct{}
	once                     sync.Once
}

func (p *idlePeer) reply(addr string) idleReply {
	return idleReply{OK: true, Pid: os.Getpid(), Goroutines: runtime.NumGoroutine(), PeerAddr: addr,
		Rounds: p.rounds.Load(), Missed: p.missed.Load(), Failures: p.failures.Load()}
}

// startFetching starts the fetch loop and answers after its first
// verified round.
func (p *idlePeer) startFetching() idleReply {
	if !p.started {
		p.started, p.first = true, make(chan struct{})
		go p.loop()
	}
	select {
	case <-p.first:
		return p.reply("")
	case <-p.done:
		return idleReply{Err: "fetch loop ended before its first round"}
	case <-time.After(time.Minute):
		return idleReply{Err: "no verified round within a minute"}
	}
}

func (p *idlePeer) loop() {
	defer close(p.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.stop:
		case <-p.done:
		}
		cancel()
	}()
	want := make([]byte, p.m.Pool().BlockBytes())
	for n := 0; ; n++ {
		ok, err := p.round(ctx, n, want)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			p.failures.Add(1)
		case ok:
			if p.rounds.Add(1) == 1 {
				close(p.first)
			}
			continue
		default:
			p.missed.Add(1)
		}
		// NB: the measured node is gone (or refused); a bench child backs
		// off rather than spin.
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// round fetches every key from the measured node into this node's pool,
// verifies every byte, then clears this node's primary tier so the next
// round fetches again. It reports false when a key was not fetched.
func (p *idlePeer) round(ctx context.Context, n int, want []byte) (bool, error) {
	req := &messages.ReqContext{RequestID: fmt.Sprintf("fetch-%d", n)}
	defer p.m.RequestFinished(ctx, req) //nolint:errcheck // best effort: the round is over
	if _, err := p.m.Lookup(ctx, req, p.keys, true); err != nil {
		return false, err
	}
	if err := p.node.TieringIdle(ctx); err != nil {
		return false, err
	}
	st, err := p.m.Lookup(ctx, req, p.keys, true)
	if err != nil {
		return false, err
	}
	for _, s := range st {
		if s != messages.Hit {
			return false, p.m.ResetCache(ctx)
		}
	}
	job, err := p.m.PrepareLoad(ctx, req, p.keys)
	if err != nil {
		return false, err
	}
	for i, k := range p.keys {
		idleFill(want, k)
		if string(want) != string(p.m.Pool().Slot(job.Slots[i])) {
			return false, fmt.Errorf("block %d differs from what the measured node stored", i)
		}
	}
	if err := p.m.CompleteLoad(ctx, req, p.keys); err != nil {
		return false, err
	}
	return true, p.m.ResetCache(ctx)
}

func (p *idlePeer) close() {
	p.once.Do(func() {
		close(p.stop)
		if p.started {
			<-p.done
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.node.Close(ctx)
	})
}

// idleFill is the content of key k's block, known to both sides.
func idleFill(b []byte, k messages.Key) {
	seed := k.Hash[0] ^ k.Hash[7] ^ k.Hash[6]*31
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>8)
	}
}
