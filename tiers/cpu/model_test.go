package cpu

import (
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/messages"
)

// Randomised tests of State against a naive reference model.
//
// Every sequence is generated from its own seed. A failure prints the seed
// and the operations so far; rerun one sequence with
//
//	go test ./tiers/cpu/ -run TestStateModel -args -seed=N
//	KVTIER_SEED=N go test ./tiers/cpu/ -run TestStateModel
//
// and scale the number of sequences with -seqs=N (or KVTIER_SEQS=N).

var (
	seedFlag = flag.Int64("seed", 0, "run only the randomised sequence with this seed")
	seqsFlag = flag.Int("seqs", 0, "number of randomised sequences (0 = default)")
)

// seeds returns the seeds of the sequences a randomised test runs: the one
// asked for, or n consecutive seeds from base.
func seeds(t *testing.T, base int64, n int) []int64 {
	t.Helper()
	if *seedFlag != 0 {
		return []int64{*seedFlag}
	}
	if v := os.Getenv("KVTIER_SEED"); v != "" {
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("KVTIER_SEED=%q: %v", v, err)
		}
		return []int64{s}
	}
	if *seqsFlag > 0 {
		n = *seqsFlag
	} else if v := os.Getenv("KVTIER_SEQS"); v != "" {
		if m, err := strconv.Atoi(v); err == nil && m > 0 {
			n = m
		}
	}
	out := make([]int64, n)
	for i := range out {
		out[i] = base + int64(i)
	}
	return out
}

// fakeClock is the injected clock: it moves only when the test says so.
type fakeClock struct{ t time.Time }

func newFakeClock() *fakeClock               { return &fakeClock{t: time.Unix(1_000_000, 0)} }
func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }
func (c *fakeClock) set(at time.Time)        { c.t = at }
func (c *fakeClock) since0() time.Duration   { return c.t.Sub(time.Unix(1_000_000, 0)) }

// tk is test key i: h000, h001, ...
func tk(i int) messages.Key { return testKeys[i] }

func engineHolder(id string) messages.Holder {
	return messages.Holder{Origin: messages.OriginEngine, ID: id}
}
func engineJob(id messages.JobID) messages.JobRef {
	return messages.JobRef{Origin: messages.OriginEngine, ID: id}
}

// testKeys are the key space of every test here: h000, h001, ...
var testKeys = func() []messages.Key {
	ks := make([]messages.Key, 256)
	for i := range ks {
		ks[i] = messages.Key{Namespace: "ns", Hash: fmt.Sprintf("h%03d", i), Group: uint32(i % 3)}
	}
	return ks
}()

// ---------------------------------------------------------------------------
// The reference model: maps and a use counter, written from the documented
// semantics (state.go, policy.go, docs/DESIGN.md §4.1, §5.1), not from the implementation.

type mEntry struct {
	ready   bool
	writer  messages.JobRef // while pending
	lastUse uint64          // LRU recency: commit-to-ready, LeaseToPin, Touch
	sum     uint32
	touched bool // while pending: touched (ranked then; its commit keeps the rank)
}

type mLease struct {
	h messages.Holder
	k messages.Key
}

type model struct {
	n      int
	keys   map[messages.Key]*mEntry
	leases map[mLease]time.Time
	pins   map[messages.JobRef]map[messages.Key]int
	// ghosts are blocks Clear removed while pinned: per job, pins on the
	// cleared copy of a key; the slot stays used until the last goes.
	ghosts  map[messages.JobRef]map[messages.Key]int
	nGhosts int // slots held by ghosts
	// budget is the bytes every block may take together, and size a key's
	// block's bytes (its geometry's): n and 1 with one geometry.
	budget     int64
	size       func(messages.Key) int64
	ghostBytes int64 // bytes held by ghosts
	use        uint64
	counters   Counters
	now        func() time.Time
}

func newModel(n int, now func() time.Time) *model {
	return &model{n: n, keys: map[messages.Key]*mEntry{}, leases: map[mLease]time.Time{},
		pins: map[messages.JobRef]map[messages.Key]int{}, ghosts: map[messages.JobRef]map[messages.Key]int{}, now: now,
		budget: int64(n), size: func(messages.Key) int64 { return 1 }}
}

// freeBytes is the budget no block or ghost takes.
func (m *model) freeBytes() int64 {
	b := m.budget - m.ghostBytes
	for k := range m.keys {
		b -= m.size(k)
	}
	return b
}

func (m *model) bump(e *mEntry) { m.use++; e.lastUse = m.use }

// expire ends every lease due by now: a lease at T is live while now < T.
func (m *model) expire() {
	now := m.now()
	for lk, at := range m.leases {
		if !at.After(now) {
			delete(m.leases, lk)
			m.counters.LeasesExpired++
		}
	}
}

func (m *model) pinsOn(k messages.Key) int {
	n := 0
	for _, ks := range m.pins {
		n += ks[k]
	}
	return n
}

func (m *model) leased(k messages.Key) bool {
	for lk := range m.leases {
		if lk.k == k {
			return true
		}
	}
	return false
}

func (m *model) status(k messages.Key) messages.LookupStatus {
	e, ok := m.keys[k]
	switch {
	case !ok:
		return messages.Miss
	case !e.ready:
		return messages.HitPending
	}
	return messages.Hit
}

func (m *model) lookup(h messages.Holder, keys []messages.Key, prefix bool, ttl time.Duration) []messages.LookupStatus {
	m.expire()
	out := make([]messages.LookupStatus, len(keys))
	for i, k := range keys {
		m.counters.Lookups++
		st := m.status(k)
		out[i] = st
		switch st {
		case messages.Hit:
			m.counters.Hits++
			// A repeated lookup extends a lease; it never shortens one.
			if at, held := m.leases[mLease{h, k}]; !held || m.now().Add(ttl).After(at) {
				m.leases[mLease{h, k}] = m.now().Add(ttl)
			}
		case messages.HitPending:
			m.counters.HitsPending++
		default:
			m.counters.Misses++
		}
		if prefix && st != messages.Hit {
			break
		}
	}
	return out
}

func (m *model) leaseToPin(h messages.Holder, job messages.JobRef, keys []messages.Key) error {
	m.expire()
	for _, k := range keys {
		if m.status(k) != messages.Hit {
			return messages.ErrUnknownKey
		}
	}
	for _, k := range keys {
		delete(m.leases, mLease{h, k})
		if m.pins[job] == nil {
			m.pins[job] = map[messages.Key]int{}
		}
		m.pins[job][k]++
		m.bump(m.keys[k])
	}
	return nil
}

func (m *model) touch(keys []messages.Key) {
	for _, k := range keys {
		e, ok := m.keys[k]
		switch {
		case !ok:
		case e.ready:
			m.bump(e)
		default:
			m.bump(e)
			e.touched = true
		}
	}
}

func (m *model) unpin(job messages.JobRef, keys []messages.Key) error {
	live, ghost := map[messages.Key]int{}, map[messages.Key]int{}
	for _, k := range keys {
		// As the State: the live copy this job pinned first, else a copy
		// Clear removed under it.
		if _, ok := m.keys[k]; ok && m.pins[job][k] > live[k] {
			live[k]++
		} else if m.ghosts[job][k] > ghost[k] {
			ghost[k]++
		} else {
			return messages.ErrNotLoading
		}
	}
	for k, n := range live {
		m.pins[job][k] -= n
		if m.pins[job][k] == 0 {
			delete(m.pins[job], k)
		}
	}
	if len(m.pins[job]) == 0 {
		delete(m.pins, job)
	}
	for k, n := range ghost {
		m.unghost(job, k, n)
	}
	return nil
}

// unghost drops n of job's pins on the cleared copy of k; the copy's slot
// is free once no job pins it.
func (m *model) unghost(job messages.JobRef, k messages.Key, n int) {
	m.ghosts[job][k] -= n
	if m.ghosts[job][k] == 0 {
		delete(m.ghosts[job], k)
		if len(m.ghosts[job]) == 0 {
			delete(m.ghosts, job)
		}
		for _, ks := range m.ghosts {
			if ks[k] > 0 {
				return
			}
		}
		m.nGhosts--
		m.ghostBytes -= m.size(k)
	}
}

func (m *model) evictable(k messages.Key) bool {
	e := m.keys[k]
	return e.ready && m.pinsOn(k) == 0 && !m.leased(k)
}

// reserveOf: absent keys (first mention) become pending for job in slots
// of bytes each; victims are evictable keys in ascending lastUse, never a
// key named in the call (vLLM's prepare_store protects them: a present key
// the caller skips storing must still be there after the call), and go
// until the budget has room for each slot in turn (bytes of any geometry
// serve any other).
func (m *model) reserveOf(bytes int64, job messages.JobRef, keys []messages.Key) (ReserveResult, error) {
	m.expire()
	var res ReserveResult
	named := map[messages.Key]bool{}
	for _, k := range keys {
		if named[k] {
			continue
		}
		named[k] = true
		if _, ok := m.keys[k]; !ok {
			res.ToStore = append(res.ToStore, k)
		}
	}
	var cands []messages.Key
	for k := range m.keys {
		if m.evictable(k) && !named[k] {
			cands = append(cands, k)
		}
	}
	slices.SortFunc(cands, func(a, b messages.Key) int {
		return int(m.keys[a].lastUse) - int(m.keys[b].lastUse)
	})
	free, obtainable := m.freeBytes(), m.freeBytes()
	for _, k := range cands {
		obtainable += m.size(k)
	}
	if int64(len(res.ToStore)) > obtainable/bytes {
		m.counters.Full++
		return ReserveResult{}, messages.ErrFull
	}
	for _, k := range res.ToStore {
		for ; free < bytes; cands = cands[1:] {
			res.Evicted = append(res.Evicted, cands[0])
			free += m.size(cands[0])
			delete(m.keys, cands[0])
			m.counters.Evictions++
		}
		free -= bytes
		m.keys[k] = &mEntry{writer: job}
	}
	return res, nil
}

func (m *model) commit(job messages.JobRef, keys []messages.Key, ok bool, sums []uint32) error {
	if ok && len(sums) != len(keys) {
		return errors.New("checksum count")
	}
	seen := map[messages.Key]bool{}
	for _, k := range keys {
		e, found := m.keys[k]
		if !found || e.ready || e.writer != job || seen[k] {
			return messages.ErrNotPending
		}
		seen[k] = true
	}
	for i, k := range keys {
		if ok {
			e := m.keys[k]
			e.ready, e.writer, e.sum = true, messages.JobRef{}, sums[i]
			if !e.touched { // a key touched while written keeps that rank
				m.bump(e)
			}
			e.touched = false
			m.counters.Stores++
		} else {
			delete(m.keys, k)
			m.counters.StoresFailed++
		}
	}
	return nil
}

func (m *model) releaseJob(job messages.JobRef) []messages.Key {
	delete(m.pins, job)
	for k, n := range m.ghosts[job] {
		m.unghost(job, k, n)
	}
	var aborted []messages.Key
	for k, e := range m.keys {
		if !e.ready && e.writer == job {
			aborted = append(aborted, k)
			delete(m.keys, k)
			m.counters.StoresFailed++
		}
	}
	return aborted
}

func (m *model) releaseHolder(h messages.Holder) {
	for lk := range m.leases {
		if lk.h == h {
			delete(m.leases, lk)
		}
	}
}

func (m *model) releaseOrigin(o messages.Origin) {
	for lk := range m.leases {
		if lk.h.Origin == o {
			delete(m.leases, lk)
		}
	}
	jobs := map[messages.JobRef]bool{}
	for j := range m.pins {
		jobs[j] = true
	}
	for j := range m.ghosts {
		jobs[j] = true
	}
	for _, e := range m.keys {
		if !e.ready {
			jobs[e.writer] = true
		}
	}
	for j := range jobs {
		if j.Origin == o {
			m.releaseJob(j)
		}
	}
}

func (m *model) dropKey(k messages.Key) {
	for lk := range m.leases {
		if lk.k == k {
			delete(m.leases, lk)
		}
	}
	delete(m.keys, k)
}

func (m *model) clear() []messages.Key {
	var removed []messages.Key
	for k, e := range m.keys {
		if !e.ready {
			continue
		}
		removed = append(removed, k)
		if m.pinsOn(k) > 0 {
			// Pinned: unindexed now, its slot freed at its last unpin.
			for job, ks := range m.pins {
				if n := ks[k]; n > 0 {
					if m.ghosts[job] == nil {
						m.ghosts[job] = map[messages.Key]int{}
					}
					m.ghosts[job][k] += n
					delete(ks, k)
					if len(ks) == 0 {
						delete(m.pins, job)
					}
				}
			}
			m.nGhosts++
			m.ghostBytes += m.size(k)
		}
		m.dropKey(k)
	}
	return removed
}

func (m *model) drop(k messages.Key) bool {
	e, ok := m.keys[k]
	if !ok || !e.ready || m.pinsOn(k) > 0 {
		return false
	}
	m.dropKey(k)
	return true
}

func (m *model) occupancy() Occupancy {
	m.expire()
	o := Occupancy{Slots: m.n, Free: m.n - len(m.keys) - m.nGhosts, Leases: len(m.leases),
		Ready: m.nGhosts, Pinned: m.nGhosts}
	for k, e := range m.keys {
		if e.ready {
			o.Ready++
		} else {
			o.WritePending++
		}
		if m.pinsOn(k) > 0 {
			o.Pinned++
		}
		if m.leased(k) {
			o.Leased++
		}
	}
	return o
}

func (m *model) nextExpiry() (time.Time, bool) {
	var best time.Time
	found := false
	for _, at := range m.leases {
		if !found || at.Before(best) {
			best, found = at, true
		}
	}
	return best, found
}

// ---------------------------------------------------------------------------
// The sequence runner.

type seqRun struct {
	t      *testing.T
	seed   int64
	rng    *rand.Rand
	clk    *fakeClock
	s      *State
	m      *model
	nkeys  int
	slotOf map[messages.Key]int // slot the State gave each key, while present
	// sizes, when set, are the bytes of the geometries a mixed run
	// reserves in: key i's block is of geometry i % len(sizes).
	sizes []int64
	log   []logEntry
}

// logEntry is one op of the log, formatted only when a sequence fails.
type logEntry struct {
	format string
	args   []any
}

var (
	modelHolders = []messages.Holder{
		engineHolder("r1"), engineHolder("r2"), engineHolder("r3"),
		{Origin: messages.OriginPeer, ID: "r1"}, // same id, other origin
	}
	modelJobs = []messages.JobRef{
		engineJob(1), engineJob(2), engineJob(3),
		{Origin: messages.OriginTier, ID: 1}, // same id, other origin
		{Origin: messages.OriginPeer, ID: 7},
	}
	modelOrigins = []messages.Origin{messages.OriginEngine, messages.OriginTier, messages.OriginPeer}
	modelTTLs    = []time.Duration{0, time.Second, 2 * time.Second, 3 * time.Second, 5 * time.Second, 10 * time.Second}
)

func (r *seqRun) logf(format string, a ...any) {
	r.log = append(r.log, logEntry{format, a})
}

// fmtArgs renders keys, holders and jobs readably for the op log.
func fmtArgs(a []any) []any {
	for i, v := range a {
		switch v := v.(type) {
		case []messages.Key:
			a[i] = fmtKeys(v)
		case messages.Key:
			a[i] = v.Hash
		case messages.Holder:
			a[i] = fmt.Sprintf("%s:%s", originName(v.Origin), v.ID)
		case messages.JobRef:
			a[i] = fmt.Sprintf("%s#%d", originName(v.Origin), v.ID)
		case messages.Origin:
			a[i] = originName(v)
		}
	}
	return a
}

func fmtKeys(ks []messages.Key) string {
	hs := make([]string, len(ks))
	for i, k := range ks {
		hs[i] = k.Hash
	}
	return "[" + strings.Join(hs, " ") + "]"
}

func originName(o messages.Origin) string {
	switch o {
	case messages.OriginEngine:
		return "engine"
	case messages.OriginTier:
		return "tier"
	case messages.OriginPeer:
		return "peer"
	}
	return strconv.Itoa(int(o))
}

func (r *seqRun) fatalf(format string, a ...any) {
	r.t.Helper()
	ops := make([]string, len(r.log))
	for i, e := range r.log {
		ops[i] = fmt.Sprintf(e.format, fmtArgs(e.args)...)
	}
	r.t.Fatalf("seed %d (rerun: go test ./tiers/cpu/ -run '%s' -args -seed=%d): %s\nops:\n  %s",
		r.seed, r.t.Name(), r.seed, fmt.Sprintf(format, fmtArgs(a)...), strings.Join(ops, "\n  "))
}

func (r *seqRun) key() messages.Key { return tk(r.rng.Intn(r.nkeys)) }

// keys draws 1..max keys, sometimes with a repeat.
func (r *seqRun) keys(max int) []messages.Key {
	ks := make([]messages.Key, 1+r.rng.Intn(max))
	for i := range ks {
		ks[i] = r.key()
	}
	if len(ks) > 1 && r.rng.Intn(8) == 0 {
		ks[len(ks)-1] = ks[0]
	}
	return ks
}

// presentKeys draws keys the model holds in the given readiness, else random.
func (r *seqRun) presentKeys(max int, ready bool) []messages.Key {
	var pool []messages.Key
	for i := range r.nkeys {
		if e, ok := r.m.keys[tk(i)]; ok && e.ready == ready {
			pool = append(pool, tk(i))
		}
	}
	if len(pool) == 0 {
		return r.keys(max)
	}
	ks := make([]messages.Key, 1+r.rng.Intn(max))
	for i := range ks {
		ks[i] = pool[r.rng.Intn(len(pool))]
	}
	return ks
}

// pendingOf returns the model's pending keys of job in a deterministic order.
func (r *seqRun) pendingOf(job messages.JobRef) []messages.Key {
	var out []messages.Key
	for i := range r.nkeys {
		if e, ok := r.m.keys[tk(i)]; ok && !e.ready && e.writer == job {
			out = append(out, tk(i))
		}
	}
	return out
}

func sameErr(got, want error) bool {
	if want == nil || got == nil {
		return (got == nil) == (want == nil)
	}
	for _, s := range []error{messages.ErrUnknownKey, messages.ErrNotPending, messages.ErrNotLoading, messages.ErrFull} {
		if errors.Is(want, s) {
			return errors.Is(got, s)
		}
	}
	return true // a non-sentinel error: any error will do
}

func sortedKeys(ks []messages.Key) []messages.Key {
	out := slices.Clone(ks)
	slices.SortFunc(out, func(a, b messages.Key) int { return strings.Compare(a.Hash, b.Hash) })
	return out
}

func (r *seqRun) checkSlots(keys []messages.Key, slots []int) {
	if len(slots) != len(keys) {
		r.fatalf("%d slots for %d keys", len(slots), len(keys))
	}
	for i, k := range keys {
		if want, ok := r.slotOf[k]; !ok || want != slots[i] {
			r.fatalf("key %v in slot %d, reserved in slot %d (known %v)", k, slots[i], want, ok)
		}
	}
}

// step runs one random operation on both and compares the answers.
func (r *seqRun) step() {
	rng := r.rng
	switch op := rng.Intn(100); {
	case op < 18: // LookupAndLease
		h := modelHolders[rng.Intn(len(modelHolders))]
		ks, prefix, ttl := r.keys(5), rng.Intn(2) == 0, modelTTLs[rng.Intn(len(modelTTLs))]
		if rng.Intn(2) == 0 {
			ks = r.presentKeys(5, true)
		}
		r.logf("t=%v LookupAndLease(%v, %v, prefix=%v, ttl=%v)", r.clk.since0(), h, ks, prefix, ttl)
		got, want := r.s.LookupAndLease(h, ks, prefix, ttl), r.m.lookup(h, ks, prefix, ttl)
		if !slices.Equal(got, want) {
			r.fatalf("LookupAndLease = %v, model %v", got, want)
		}
	case op < 28: // LeaseToPin
		h, job := modelHolders[rng.Intn(len(modelHolders))], modelJobs[rng.Intn(len(modelJobs))]
		ks := r.presentKeys(3, true)
		if rng.Intn(6) == 0 {
			ks = append(ks, r.key())
		}
		r.logf("t=%v LeaseToPin(%v, %v, %v)", r.clk.since0(), h, job, ks)
		slots, err := r.s.LeaseToPin(h, job, ks)
		werr := r.m.leaseToPin(h, job, ks)
		if !sameErr(err, werr) {
			r.fatalf("LeaseToPin err %v, model %v", err, werr)
		}
		if err == nil {
			r.checkSlots(ks, slots)
		}
	case op < 33: // Touch
		ks := r.keys(4)
		r.logf("Touch(%v)", ks)
		r.s.Touch(ks)
		r.m.touch(ks)
	case op < 42: // Unpin
		job := modelJobs[rng.Intn(len(modelJobs))]
		var ks []messages.Key
		for k, n := range r.m.pins[job] {
			for range n {
				if rng.Intn(2) == 0 {
					ks = append(ks, k)
				}
			}
		}
		ks = sortedKeys(ks)
		if len(ks) == 0 || rng.Intn(6) == 0 {
			ks = append(ks, r.key())
		}
		r.logf("Unpin(%v, %v)", job, ks)
		err, werr := r.s.Unpin(job, ks), r.m.unpin(job, ks)
		if !sameErr(err, werr) {
			r.fatalf("Unpin err %v, model %v", err, werr)
		}
	case op < 58: // Reserve
		job := modelJobs[rng.Intn(len(modelJobs))]
		ks, gi, bytes := r.keys(6), 0, int64(1)
		if r.sizes != nil {
			gi = rng.Intn(len(r.sizes))
			ks, bytes = r.ofGeometry(ks, gi), r.sizes[gi]
		}
		r.logf("t=%v Reserve(%v, %v) in geometry %d", r.clk.since0(), job, ks, gi)
		if r.sizes != nil {
			r.reserveMixed(gi, job, ks)
			break
		}
		got, err := r.s.ReserveIn(gi, job, ks)
		want, werr := r.m.reserveOf(bytes, job, ks)
		if !sameErr(err, werr) {
			r.fatalf("Reserve err %v, model %v", err, werr)
		}
		if !slices.Equal(got.ToStore, want.ToStore) || !slices.Equal(got.Evicted, want.Evicted) {
			r.fatalf("Reserve = toStore %v evicted %v, model toStore %v evicted %v",
				got.ToStore, got.Evicted, want.ToStore, want.Evicted)
		}
		if len(got.Slots) != len(got.ToStore) {
			r.fatalf("Reserve: %d slots for %d keys", len(got.Slots), len(got.ToStore))
		}
		for _, k := range got.Evicted {
			delete(r.slotOf, k)
		}
		for i, k := range got.ToStore {
			r.slotOf[k] = got.Slots[i]
		}
	case op < 74: // Commit
		job := modelJobs[rng.Intn(len(modelJobs))]
		ks := r.pendingOf(job)
		rng.Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
		if len(ks) > 0 {
			ks = ks[:1+rng.Intn(len(ks))]
		}
		switch rng.Intn(12) {
		case 0: // a key this job is not writing
			ks = append(ks, r.key())
		case 1: // a key named twice
			if len(ks) > 0 {
				ks = append(ks, ks[0])
			}
		case 2: // the wrong job
			job = modelJobs[rng.Intn(len(modelJobs))]
		}
		ok := rng.Intn(4) != 0
		sums := make([]uint32, len(ks))
		for i := range sums {
			sums[i] = rng.Uint32()
		}
		if ok && rng.Intn(20) == 0 {
			sums = sums[:len(sums)/2] // wrong count: a plain error, nothing changes
		}
		r.logf("Commit(%v, %v, ok=%v, %d sums)", job, ks, ok, len(sums))
		err, werr := r.s.Commit(job, ks, ok, sums), r.m.commit(job, ks, ok, sums)
		if !sameErr(err, werr) {
			r.fatalf("Commit err %v, model %v", err, werr)
		}
		if err == nil && !ok {
			for _, k := range ks {
				delete(r.slotOf, k)
			}
		}
		if err == nil && ok {
			for i, k := range ks {
				slot, sum, cerr := r.s.Checksum(k)
				if cerr != nil || slot != r.slotOf[k] || sum != sums[i] {
					r.fatalf("Checksum(%v) = %d %08x %v, want %d %08x", k, slot, sum, cerr, r.slotOf[k], sums[i])
				}
			}
		}
	case op < 78: // ReleaseJob
		job := modelJobs[rng.Intn(len(modelJobs))]
		r.logf("ReleaseJob(%v)", job)
		got, want := r.s.ReleaseJob(job), r.m.releaseJob(job)
		if !slices.Equal(sortedKeys(got), sortedKeys(want)) {
			r.fatalf("ReleaseJob aborted %v, model %v", got, want)
		}
		for _, k := range got {
			delete(r.slotOf, k)
		}
	case op < 82: // ReleaseHolder
		h := modelHolders[rng.Intn(len(modelHolders))]
		r.logf("ReleaseHolder(%v)", h)
		r.s.ReleaseHolder(h)
		r.m.releaseHolder(h)
	case op < 84: // ReleaseOrigin
		o := modelOrigins[rng.Intn(len(modelOrigins))]
		r.logf("ReleaseOrigin(%v)", o)
		r.s.ReleaseOrigin(o)
		r.m.releaseOrigin(o)
		r.resyncSlots()
	case op < 85: // Clear
		r.logf("Clear()")
		got, want := r.s.Clear(), r.m.clear()
		if !slices.Equal(sortedKeys(got), sortedKeys(want)) {
			r.fatalf("Clear removed %v, model %v", got, want)
		}
		r.resyncSlots()
	case op < 87: // Drop
		k := r.key()
		r.logf("Drop(%v)", k)
		if got, want := r.s.Drop(k), r.m.drop(k); got != want {
			r.fatalf("Drop = %v, model %v", got, want)
		}
		r.resyncSlots()
	case op < 89: // Status and NextLeaseExpiry: read-only answers
		ks := r.keys(6)
		r.logf("Status(%v); NextLeaseExpiry()", ks)
		got, want := r.s.Status(ks), make([]messages.LookupStatus, len(ks))
		for i, k := range ks {
			want[i] = r.m.status(k)
		}
		if !slices.Equal(got, want) {
			r.fatalf("Status = %v, model %v", got, want)
		}
		at, ok := r.s.NextLeaseExpiry()
		wat, wok := r.m.nextExpiry()
		if ok != wok || !at.Equal(wat) {
			r.fatalf("NextLeaseExpiry = %v %v, model %v %v", at, ok, wat, wok)
		}
	default: // the clock moves: sometimes exactly onto the next deadline
		if at, ok := r.m.nextExpiry(); ok && at.After(r.clk.now()) && rng.Intn(3) == 0 {
			r.clk.set(at)
		} else {
			r.clk.advance(time.Duration(rng.Intn(4000)) * time.Millisecond)
		}
		r.logf("clock → t=%v", r.clk.since0())
		return // not a State call: the next op meets the due leases unexpired
	}
	r.check()
}

// resyncSlots forgets slots of keys the model no longer holds.
func (r *seqRun) resyncSlots() {
	for k := range r.slotOf {
		if _, ok := r.m.keys[k]; !ok {
			delete(r.slotOf, k)
		}
	}
}

func (r *seqRun) check() {
	if err := r.s.CheckInvariants(); err != nil {
		r.fatalf("invariants: %v", err)
	}
	got, want := r.s.Occupancy(), r.m.occupancy()
	if r.sizes != nil { // NB: slots, free and committed, are the State's to choose; its budget check is CheckInvariants'
		got.Slots, got.Free, want.Slots, want.Free = 0, 0, 0, 0
	}
	if got != want {
		r.fatalf("Occupancy = %+v, model %+v", got, want)
	}
	if r.s.Counters != r.m.counters {
		r.fatalf("Counters = %+v, model %+v", r.s.Counters, r.m.counters)
	}
}

// TestStateModel runs each sequence under "lru" and under "prefix": with
// no parent known (Commit carries no provenance) prefix's order is LRU's,
// so the one LRU model answers both.
func TestStateModel(t *testing.T) {
	for _, seed := range seeds(t, 1, 10_000) {
		for _, policy := range []string{"lru", "prefix"} {
			rng := rand.New(rand.NewSource(seed))
			n := 4 + rng.Intn(13)
			clk := newFakeClock()
			s, err := NewState(n, policy, clk.now)
			if err != nil {
				t.Fatal(err)
			}
			r := &seqRun{t: t, seed: seed, rng: rng, clk: clk, s: s, m: newModel(n, clk.now),
				nkeys: 2 * n, slotOf: map[messages.Key]int{}}
			r.logf("NewState(%d, %s)", n, policy)
			r.run(20+rng.Intn(26), r.step)
		}
	}
}

// run runs ops of step (the run's own, or an extended run's), turning a
// panic into a failure that names the seed.
func (r *seqRun) run(ops int, step func()) {
	r.t.Helper()
	defer func() {
		if p := recover(); p != nil {
			r.fatalf("panic: %v\n%s", p, debug.Stack())
		}
	}()
	for range ops {
		step()
	}
}

// ---------------------------------------------------------------------------
// The must-hold property (docs/DESIGN.md §4.1): a HIT is never evicted before
// its PrepareLoad, even with concurrent stores evicting at full pool, and
// PrepareLoad (LeaseToPin) never fails for a key that was a HIT for that
// request and whose lease has not expired.

type leaseRun struct {
	seqRun
	granted map[messages.Holder]map[messages.Key]time.Time // the latest HIT's lease deadline
	loadJob map[messages.Holder]messages.JobRef
}

var (
	leaseHolders = []messages.Holder{engineHolder("a"), engineHolder("b"), engineHolder("c")}
	storeJobs    = []messages.JobRef{
		{Origin: messages.OriginTier, ID: 1}, {Origin: messages.OriginTier, ID: 2},
		{Origin: messages.OriginPeer, ID: 1}, engineJob(100),
	}
	leaseTTLs = []time.Duration{0, 500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second}
)

// live is the set of keys h holds a HIT for whose lease has not expired.
func (r *leaseRun) live(h messages.Holder) []messages.Key {
	var out []messages.Key
	for k, at := range r.granted[h] {
		if at.After(r.clk.now()) {
			out = append(out, k)
		}
	}
	return sortedKeys(out)
}

func (r *leaseRun) residentKeys() []messages.Key {
	var out []messages.Key
	for i := range r.nkeys {
		if idx, ok := r.s.index[tk(i)]; ok && r.s.slots[idx].state == slotReady {
			out = append(out, tk(i))
		}
	}
	return out
}

func (r *leaseRun) step() {
	rng := r.rng
	h := leaseHolders[rng.Intn(len(leaseHolders))]
	switch op := rng.Intn(100); {
	case op < 25: // Lookup, mostly of resident keys
		ks := r.keys(4)
		if res := r.residentKeys(); len(res) > 0 && rng.Intn(3) != 0 {
			for i := range ks {
				ks[i] = res[rng.Intn(len(res))]
			}
		}
		prefix, ttl := rng.Intn(2) == 0, leaseTTLs[rng.Intn(len(leaseTTLs))]
		r.logf("t=%v LookupAndLease(%v, %v, prefix=%v, ttl=%v)", r.clk.since0(), h, ks, prefix, ttl)
		for i, st := range r.s.LookupAndLease(h, ks, prefix, ttl) {
			if st == messages.Hit {
				if r.granted[h] == nil {
					r.granted[h] = map[messages.Key]time.Time{}
				}
				r.granted[h][ks[i]] = r.clk.now().Add(ttl)
			}
		}
	case op < 40: // PrepareLoad of some live HITs: must succeed
		ks := r.live(h)
		rng.Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
		if len(ks) > 0 {
			ks = ks[:1+rng.Intn(len(ks))]
		}
		stray := rng.Intn(5) == 0
		if stray || len(ks) == 0 {
			ks = append(ks, r.key())
		}
		r.logf("t=%v LeaseToPin(%v, %v)", r.clk.since0(), h, ks)
		_, err := r.s.LeaseToPin(h, r.loadJob[h], ks)
		if err != nil && !stray && len(r.live(h)) > 0 {
			r.fatalf("LeaseToPin of live HITs failed: %v", err)
		}
		if err == nil {
			for _, k := range ks {
				delete(r.granted[h], k) // the lease is now a pin
			}
		}
	case op < 48: // CompleteLoad
		job := r.loadJob[h]
		var ks []messages.Key
		for idx, n := range r.s.pins[job].all() {
			for range n {
				ks = append(ks, r.s.slots[idx].key)
			}
		}
		if len(ks) == 0 {
			return
		}
		r.logf("Unpin(%v, %v)", job, ks)
		if err := r.s.Unpin(job, ks); err != nil {
			r.fatalf("Unpin: %v", err)
		}
	case op < 75: // a concurrent store by another job, at full pool
		job := storeJobs[rng.Intn(len(storeJobs))]
		ks := r.keys(4)
		r.logf("t=%v Reserve(%v, %v)", r.clk.since0(), job, ks)
		res, err := r.s.Reserve(job, ks)
		if err != nil && !errors.Is(err, messages.ErrFull) {
			r.fatalf("Reserve: %v", err)
		}
		if err == nil && rng.Intn(3) != 0 {
			ok := rng.Intn(5) != 0
			r.logf("Commit(%v, %v, ok=%v)", job, res.ToStore, ok)
			if err := r.s.Commit(job, res.ToStore, ok, make([]uint32, len(res.ToStore))); err != nil {
				r.fatalf("Commit: %v", err)
			}
		}
	case op < 83: // a store job finishes later
		job := storeJobs[rng.Intn(len(storeJobs))]
		ks := sortedKeys(r.s.Pending(job))
		if len(ks) == 0 {
			return
		}
		ok := rng.Intn(4) != 0
		r.logf("Commit(%v, %v, ok=%v)", job, ks, ok)
		if err := r.s.Commit(job, ks, ok, make([]uint32, len(ks))); err != nil {
			r.fatalf("Commit: %v", err)
		}
	case op < 85: // a store job is reaped
		job := storeJobs[rng.Intn(len(storeJobs))]
		r.logf("ReleaseJob(%v)", job)
		r.s.ReleaseJob(job)
	case op < 87: // a restarted tier or peer forgets its work; engine leases stay
		o := []messages.Origin{messages.OriginTier, messages.OriginPeer}[rng.Intn(2)]
		r.logf("ReleaseOrigin(%v)", o)
		r.s.ReleaseOrigin(o)
	case op < 89: // RequestFinished
		r.logf("ReleaseHolder(%v)", h)
		r.s.ReleaseHolder(h)
		delete(r.granted, h)
	case op < 92:
		ks := r.keys(3)
		r.logf("Touch(%v)", ks)
		r.s.Touch(ks)
	default: // time passes, sometimes exactly onto a deadline
		if ks := r.live(h); len(ks) > 0 && rng.Intn(3) == 0 {
			r.clk.set(r.granted[h][ks[rng.Intn(len(ks))]])
		} else {
			r.clk.advance(time.Duration(rng.Intn(1500)) * time.Millisecond)
		}
		r.logf("clock → t=%v", r.clk.since0())
	}
	r.check()
}

func (r *leaseRun) check() {
	if err := r.s.CheckInvariants(); err != nil {
		r.fatalf("invariants: %v", err)
	}
	now := r.clk.now()
	for _, h := range leaseHolders {
		for k, at := range r.granted[h] {
			if !at.After(now) {
				continue
			}
			if st := r.s.lookupOne(k); st != messages.Hit {
				r.fatalf("%v's leased HIT %v (lease to %v) is %v", h, k, at.Sub(time.Unix(1_000_000, 0)), st)
			}
		}
		for idx := range r.s.pins[r.loadJob[h]].all() {
			if r.s.slots[idx].state != slotReady {
				r.fatalf("%v's pinned slot %d is not ready", h, idx)
			}
		}
	}
}

func TestLeasedHitSurvivesUntilPrepareLoad(t *testing.T) {
	for _, seed := range seeds(t, 1_000_001, 10_000) {
		rng := rand.New(rand.NewSource(seed))
		n := 4 + rng.Intn(9)
		clk := newFakeClock()
		policy := []string{"lru", "arc", "prefix"}[rng.Intn(3)]
		s, err := NewState(n, policy, clk.now)
		if err != nil {
			t.Fatal(err)
		}
		r := &leaseRun{
			seqRun:  seqRun{t: t, seed: seed, rng: rng, clk: clk, s: s, nkeys: 3 * n},
			granted: map[messages.Holder]map[messages.Key]time.Time{},
			loadJob: map[messages.Holder]messages.JobRef{},
		}
		for i, h := range leaseHolders {
			r.loadJob[h] = engineJob(messages.JobID(i + 1))
		}
		// Start full: every slot ready.
		fill := make([]messages.Key, n)
		for i := range fill {
			fill[i] = tk(r.nkeys - 1 - i)
		}
		if _, err := s.Reserve(engineJob(99), fill); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(engineJob(99), fill, true, make([]uint32, n)); err != nil {
			t.Fatal(err)
		}
		r.logf("NewState(%d, %s) filled with %v", n, policy, fill)
		r.run(20+rng.Intn(21), r.step)
	}
}

// ofGeometry keeps the keys of geometry gi (key i's is i % len(sizes)),
// or names one of them when none is left.
func (r *seqRun) ofGeometry(ks []messages.Key, gi int) []messages.Key {
	out := slices.DeleteFunc(ks, func(k messages.Key) bool { return keyIndex[k]%len(r.sizes) != gi })
	if len(out) == 0 {
		out = append(out, tk((r.rng.Intn(r.nkeys/len(r.sizes))*len(r.sizes)+gi)%r.nkeys))
	}
	return out
}

// reserveMixed checks a reservation in geometry gi of a mixed run by what
// any legal one does (which blocks go is the State's choice across
// geometries: the slots' places decide what shares bytes): absent keys
// become the job's, in slots of gi's size; every block evicted was ready,
// unheld and not named by the call; on ErrFull nothing is reserved. The
// model then follows what the State did.
func (r *seqRun) reserveMixed(gi int, job messages.JobRef, keys []messages.Key) {
	m := r.m
	m.expire()
	named, absent := map[messages.Key]bool{}, []messages.Key(nil)
	for _, k := range keys {
		if !named[k] {
			named[k] = true
			if _, ok := m.keys[k]; !ok {
				absent = append(absent, k)
			}
		}
	}
	got, err := r.s.ReserveIn(gi, job, keys)
	for _, k := range got.Evicted {
		if e, ok := m.keys[k]; !ok || !m.evictable(k) || named[k] {
			r.fatalf("Reserve evicted %v: present %v, evictable %v, named %v", k, ok && e != nil, ok && m.evictable(k), named[k])
		}
		delete(m.keys, k)
		delete(r.slotOf, k)
		m.counters.Evictions++
	}
	if err != nil {
		if !errors.Is(err, messages.ErrFull) || len(got.ToStore) != 0 {
			r.fatalf("Reserve: %v with %v to store", err, got.ToStore)
		}
		m.counters.Full++
		return
	}
	if !slices.Equal(got.ToStore, absent) || len(got.Slots) != len(absent) {
		r.fatalf("Reserve = toStore %v in %d slots, absent %v", got.ToStore, len(got.Slots), absent)
	}
	for i, k := range got.ToStore {
		if b, _ := r.s.SlotGeometry(got.Slots[i]); int64(b) != r.sizes[gi] {
			r.fatalf("Reserve in geometry %d gave %v a slot of %d bytes", gi, k, b)
		}
		m.keys[k] = &mEntry{writer: job}
		r.slotOf[k] = got.Slots[i]
	}
}

var keyIndex = func() map[messages.Key]int {
	m := make(map[messages.Key]int, len(testKeys))
	for i, k := range testKeys {
		m[k] = i
	}
	return m
}()

// TestStateModelMixedGeometries runs the sequences over two geometries of
// different sizes sharing one byte budget: each key's block is of its own
// geometry, and eviction is one LRU order across both, so the model is the
// single-geometry one counted in bytes.
func TestStateModelMixedGeometries(t *testing.T) {
	for _, seed := range seeds(t, 1, 5_000) {
		for _, policy := range []string{"lru", "prefix"} {
			rng := rand.New(rand.NewSource(seed))
			sizes := []int64{int64(2 + rng.Intn(3)), int64(5 + rng.Intn(4))}
			budget := sizes[1] + int64(rng.Intn(40))
			clk := newFakeClock()
			s, err := NewBudgetState(budget, int(sizes[0]), policy, clk.now)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, _, err := s.AddGeometry(int(sizes[1])); err != nil {
				t.Fatal(err)
			}
			m := newModel(0, clk.now)
			m.budget, m.size = budget, func(k messages.Key) int64 { return sizes[keyIndex[k]%2] }
			nkeys := 2 * int(budget/sizes[0])
			r := &seqRun{t: t, seed: seed, rng: rng, clk: clk, s: s, m: m,
				nkeys: nkeys - nkeys%2, slotOf: map[messages.Key]int{}, sizes: sizes}
			r.logf("NewBudgetState(%d, %v, %s)", budget, sizes, policy)
			r.run(20+rng.Intn(40), r.step)
		}
	}
}
