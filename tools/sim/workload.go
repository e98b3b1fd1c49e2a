package sim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"time"
)

// Request is one inference request of a workload: its arrival on the
// workload's clock and its prompt as a prefix chain of block ids (equal ids
// mean the same prefix, so an id also names everything before it).
type Request struct {
	Arrival      time.Duration // since the start of the workload
	InputTokens  int           // prompt length in tokens
	OutputTokens int           // generated tokens
	Blocks       []uint64      // the prompt's prefix chain, one id per full block
}

// traceLine is one line of a Mooncake FAST'25 trace.
type traceLine struct {
	Timestamp    int64    `json:"timestamp"` // ms since the start
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// ReadTrace parses a Mooncake trace (JSONL: timestamp, input_length,
// output_length, hash_ids), at most limit requests when limit > 0.
func ReadTrace(r io.Reader, limit int) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	var reqs []Request
	for line := 1; sc.Scan() && (limit <= 0 || len(reqs) < limit); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var t traceLine
		if err := json.Unmarshal(sc.Bytes(), &t); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		reqs = append(reqs, Request{
			Arrival:      time.Duration(t.Timestamp) * time.Millisecond,
			InputTokens:  t.InputLength,
			OutputTokens: t.OutputLength,
			Blocks:       t.HashIDs,
		})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	return reqs, nil
}

// ReadTraceFile reads a trace file with ReadTrace.
func ReadTraceFile(path string, limit int) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadTrace(f, limit)
}

// SyntheticConfig shapes the synthetic multi-turn workload.
type SyntheticConfig struct {
	Seed          uint64        // same seed, same workload
	Requests      int           // total requests
	SystemPrompts int           // shared system prompts (Zipf-popular)
	Concurrent    int           // conversations open at once
	Interarrival  time.Duration // mean gap between requests
}

// DefaultSynthetic is the workload `kvtier sim` runs with no flags.
func DefaultSynthetic(seed uint64, requests int) SyntheticConfig {
	return SyntheticConfig{Seed: seed, Requests: requests, SystemPrompts: 16,
		Concurrent: 256, Interarrival: 50 * time.Millisecond}
}

// conversation is one open synthetic chat: its prompt so far and turns left.
type conversation struct {
	history []uint64
	turns   int
}

// synth generates a synthetic workload; it owns the id space and the rng.
type synth struct {
	cfg    SyntheticConfig
	rng    *rand.Rand
	zipf   *rand.Zipf
	nextID uint64
	system [][]uint64
}

// Synthetic generates a multi-turn chat workload: conversations open on one
// of a few popular system prompts, and each turn's prompt is the previous
// prompt plus the previous answer plus new user blocks, so turns share their
// conversation's prefix and conversations share their system prompt.
// Conversations interleave, so reuse distance grows with Concurrent.
func Synthetic(cfg SyntheticConfig) []Request {
	s := &synth{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x6b7674696572))}
	s.zipf = rand.NewZipf(s.rng, 1.2, 1, uint64(max(cfg.SystemPrompts, 1)-1))
	for range max(cfg.SystemPrompts, 1) {
		s.system = append(s.system, s.fresh(2+s.rng.IntN(6)))
	}
	open := make([]*conversation, 0, cfg.Concurrent)
	reqs := make([]Request, 0, cfg.Requests)
	var at time.Duration
	for len(reqs) < cfg.Requests {
		if len(open) < max(cfg.Concurrent, 1) {
			open = append(open, s.open())
			continue
		}
		i := s.rng.IntN(len(open))
		reqs = append(reqs, s.turn(open[i], at))
		at += time.Duration(s.rng.ExpFloat64() * float64(cfg.Interarrival))
		if open[i].turns == 0 {
			open = append(open[:i], open[i+1:]...)
		}
	}
	return reqs
}

// fresh returns n never-used block ids.
func (s *synth) fresh(n int) []uint64 {
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = s.nextID
		s.nextID++
	}
	return ids
}

// open starts a conversation on a Zipf-chosen system prompt.
func (s *synth) open() *conversation {
	sys := s.system[s.zipf.Uint64()]
	return &conversation{history: append([]uint64(nil), sys...), turns: 1 + s.rng.IntN(8)}
}

// turn issues c's next request and grows its history by the user's blocks
// and the answer's blocks.
func (s *synth) turn(c *conversation, at time.Duration) Request {
	c.history = append(c.history, s.fresh(1+s.rng.IntN(4))...)
	prompt := append([]uint64(nil), c.history...)
	out := 64 + s.rng.IntN(1024)
	c.history = append(c.history, s.fresh(out/TokensPerBlock)...)
	c.turns--
	return Request{Arrival: at, InputTokens: len(prompt) * TokensPerBlock, OutputTokens: out, Blocks: prompt}
}

// IdealHitRate is the fraction of prompt blocks an unbounded cache would hit
// on reqs in order, with prefix semantics: a block hits only if it and every
// block before it in its chain were seen by an earlier request.
func IdealHitRate(reqs []Request) float64 {
	seen := make(map[uint64]struct{})
	var hits, total int
	for _, r := range reqs {
		prefix := true
		for _, id := range r.Blocks {
			_, ok := seen[id]
			prefix = prefix && ok
			if prefix {
				hits++
			}
			seen[id] = struct{}{}
		}
		total += len(r.Blocks)
	}
	return ratio(hits, total)
}

// ratio is a/b, 0 when b is 0.
func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
