package bench

// The engine-poll scenario (issue 29): what polling an engine's unix://
// connection (Config.EnginePoll) buys the engine and costs the node's
// peers. One standalone node per setting, each with a peer node and an
// out-of-process engine (the idle scenario's children, idlechild.go):
// while the engine calls Lookup in bursts, as a scheduler's step does, the
// peer times its lookups that the node answers. The settings take turns,
// round after round, so both see the same box; the figures are medians
// over rounds, and the ratios are the polled setting's over the unpolled.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/kvtier/kvtier/internal/testutil/freeport"
	"github.com/kvtier/kvtier/messages"
)

// EnginePollOptions size the engine-poll scenario.
type EnginePollOptions struct {
	Poll       time.Duration // the polled setting's window (the other is 0: off)
	Rounds     int           // measurement rounds per setting, alternating
	Probes     int           // peer lookups timed per round
	ProbeGap   time.Duration // idle time before each peer lookup
	BurstCalls int           // the engine's back-to-back Lookups per step
	BurstKeys  int           // keys per Lookup (held by the node: HITs)
	StepGap    time.Duration // the engine's idle time between bursts (the model's step)
	BlockBytes int
	Slots      int
	Timeout    time.Duration
	// Child runs a child process (the idle scenario's roles); nil: this
	// executable as `kvtier bench idle child ARGS...`.
	Child func(args ...string) *exec.Cmd
}

// DefaultEnginePollOptions is what `kvtier bench engine-poll` runs with no
// flags: vLLM's scheduler calls a few Lookups per step, a step is a few
// milliseconds.
func DefaultEnginePollOptions() EnginePollOptions {
	return EnginePollOptions{Poll: 100 * time.Microsecond, Rounds: 6, Probes: 150, ProbeGap: 2 * time.Millisecond,
		BurstCalls: 8, BurstKeys: 16, StepGap: 5 * time.Millisecond, BlockBytes: 64 << 10, Slots: 256,
		Timeout: 10 * time.Minute}
}

// EnginePollSide is one setting's figures: medians over its rounds.
type EnginePollSide struct {
	PollUs              float64 `json:"poll_us"`
	EngineLookupP50us   float64 `json:"engine_lookup_p50_us"` // the engine's Lookups during its bursts
	EngineLookupP99us   float64 `json:"engine_lookup_p99_us"`
	PeerLookupP50us     float64 `json:"peer_lookup_p50_us"` // a peer's lookups the node answers, meanwhile
	PeerLookupP99us     float64 `json:"peer_lookup_p99_us"`
	IdlePeerLookupP50us float64 `json:"idle_peer_lookup_p50_us"` // the same with the engine idle: the floor
	EngineLookups       int     `json:"engine_lookups"`
	PeerLookups         int     `json:"peer_lookups"`
}

// EnginePollResult is the scenario's report.
type EnginePollResult struct {
	Off EnginePollSide `json:"off"`
	On  EnginePollSide `json:"on"`
	// EngineSpeedup is the engine's Lookup p50 off over on (> 1: polling
	// helps the engine); PeerP50Ratio and PeerP99Ratio are the peer's
	// lookups on over off (> 1: polling costs the peers).
	EngineSpeedup float64 `json:"engine_p50_speedup"`
	PeerP50Ratio  float64 `json:"peer_p50_on_over_off"`
	PeerP99Ratio  float64 `json:"peer_p99_on_over_off"`
	// Verdict is the default the figures argue for: "on" when polling
	// speeds the engine by at least a fifth and costs the peers' p99 at
	// most a tenth, else "off".
	Verdict string `json:"verdict"`
	Rounds  int    `json:"rounds"`
}

// RunEnginePoll runs the scenario.
func RunEnginePoll(ctx context.Context, o EnginePollOptions) (EnginePollResult, error) {
	res := EnginePollResult{Rounds: o.Rounds}
	if o.Rounds < 1 || o.Probes < 1 || o.BurstCalls < 1 || o.BurstKeys < 1 || o.Slots < o.BurstKeys || o.Poll <= 0 {
		return res, fmt.Errorf("%w: bench engine-poll: rounds, probes, burst calls and keys ≥ 1, slots ≥ keys, poll > 0", messages.ErrBadConfig)
	}
	ctx, cancel, err := childScenario(ctx, &o.Child, o.Timeout)
	if err != nil {
		return res, err
	}
	defer cancel()
	sides := []*pollSetup{{poll: 0}, {poll: o.Poll}}
	for _, s := range sides {
		defer s.close()
		if err := s.start(o); err != nil {
			return res, fmt.Errorf("engine-poll %v: %w", s.poll, err)
		}
	}
	for range o.Rounds {
		for _, s := range sides {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			if err := s.round(o); err != nil {
				return res, fmt.Errorf("engine-poll %v: %w", s.poll, err)
			}
		}
	}
	res.Off, res.On = sides[0].summary(), sides[1].summary()
	res.EngineSpeedup = ratio(res.Off.EngineLookupP50us, res.On.EngineLookupP50us)
	res.PeerP50Ratio = ratio(res.On.PeerLookupP50us, res.Off.PeerLookupP50us)
	res.PeerP99Ratio = ratio(res.On.PeerLookupP99us, res.Off.PeerLookupP99us)
	res.Verdict = "off"
	if res.EngineSpeedup >= 1.2 && res.PeerP99Ratio <= 1.1 {
		res.Verdict = "on"
	}
	return res, nil
}

// pollSetup is one setting's processes and the figures of its rounds.
type pollSetup struct {
	poll                 time.Duration
	node, peer, engine   *idleChild
	dir                  string
	engine50, engine99   []float64
	peer50, peer99, idle []float64
	engineN, peerN       int
}

func (s *pollSetup) start(o EnginePollOptions) error {
	secret := make([]byte, 24)
	_, _ = rand.Read(secret)
	sec := hex.EncodeToString(secret)
	ports, err := freeport.Ports(2)
	if err != nil {
		return err
	}
	node, peer := fmt.Sprintf("tcp://127.0.0.1:%d", ports[0]), fmt.Sprintf("tcp://127.0.0.1:%d", ports[1])
	if s.dir, err = os.MkdirTemp("", "kvtier-bench-enginepoll-"); err != nil {
		return err
	}
	common := []string{"--secret", sec, "--block-bytes", strconv.Itoa(o.BlockBytes), "--slots", strconv.Itoa(o.Slots),
		"--blocks", strconv.Itoa(o.BurstKeys)}
	child := func(args ...string) (*idleChild, error) {
		return startChild[idleRequest, idleReply]("bench engine-poll "+args[0], idleRequests, o.Child(args...))
	}
	if s.peer, err = child(append([]string{"peer", "--id", "peer", "--listen", peer, "--peer", "node=" + node}, common...)...); err != nil {
		return fmt.Errorf("peer: %w", err)
	}
	if s.node, err = child(append([]string{"node", "--id", "node", "--listen", node, "--peer", "peer=" + peer,
		"--pool-path", filepath.Join(s.dir, "pool"), "--engine-listen", "unix://" + filepath.Join(s.dir, "engine.sock"),
		"--engine-poll", s.poll.String()}, common...)...); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if s.engine, err = child("engine", "--connect", s.node.ready.EngineAddr); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	_, err = s.peer.call(idleWait{})
	return err
}

// round times the peer's lookups with the engine idle, then again while
// the engine bursts (for as long as the probes take, and then some).
func (s *pollSetup) round(o EnginePollOptions) error {
	idle, err := s.peer.call(idleProbe{N: max(o.Probes/4, 1), Gap: o.ProbeGap})
	if err != nil {
		return err
	}
	s.idle = append(s.idle, idle.P50us)
	burst := time.Duration(o.Probes) * (o.ProbeGap + time.Millisecond) * 2
	if err := s.engine.send(idleBurst{Duration: burst, Calls: o.BurstCalls, Keys: o.BurstKeys, Gap: o.StepGap}); err != nil {
		return err
	}
	p, perr := s.peer.call(idleProbe{N: o.Probes, Gap: o.ProbeGap})
	e, eerr := s.engine.recv()
	if perr != nil {
		return perr
	}
	if eerr != nil {
		return eerr
	}
	s.peer50, s.peer99, s.peerN = append(s.peer50, p.P50us), append(s.peer99, p.P99us), s.peerN+int(p.Rounds)
	s.engine50, s.engine99, s.engineN = append(s.engine50, e.P50us), append(s.engine99, e.P99us), s.engineN+int(e.Rounds)
	return nil
}

func (s *pollSetup) summary() EnginePollSide {
	return EnginePollSide{PollUs: float64(s.poll.Microseconds()),
		EngineLookupP50us: median(s.engine50), EngineLookupP99us: median(s.engine99),
		PeerLookupP50us: median(s.peer50), PeerLookupP99us: median(s.peer99), IdlePeerLookupP50us: median(s.idle),
		EngineLookups: s.engineN, PeerLookups: s.peerN}
}

func (s *pollSetup) close() {
	for _, c := range []*idleChild{s.engine, s.node, s.peer} {
		if c != nil {
			c.quit()
		}
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}
