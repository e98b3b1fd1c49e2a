package cpu

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvtier/kvtier/messages"
)

func benchKeys(n int) []messages.Key {
	ns := messages.Layout{Model: "bench"}.Namespace()
	out := make([]messages.Key, n)
	for i := range out {
		var b [32]byte
		binary.BigEndian.PutUint64(b[:], uint64(i))
		out[i] = messages.Key{Namespace: ns, Hash: string(b[:])}
	}
	return out
}

func filledState(b *testing.B, slots int) (*State, []messages.Key) {
	st, err := NewState(slots, "lru", time.Now)
	if err != nil {
		b.Fatal(err)
	}
	keys := benchKeys(slots)
	job := messages.JobRef{Origin: messages.OriginEngine, ID: 1}
	r, err := st.Reserve(job, keys)
	if err != nil {
		b.Fatal(err)
	}
	if err := st.Commit(job, r.ToStore, true, make([]uint32, len(r.ToStore))); err != nil {
		b.Fatal(err)
	}
	return st, keys
}

// BenchmarkLookupAndLease2000 is a 2,000-key prefix lookup that hits and
// leases every key, then the request finishing (releasing the leases).
func BenchmarkLookupAndLease2000(b *testing.B) {
	st, keys := filledState(b, 16384)
	keys = keys[:2000]
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h := messages.Holder{Origin: messages.OriginEngine, ID: fmt.Sprint(i)}
		st.LookupAndLease(h, keys, true, 30*time.Second)
		st.ReleaseHolder(h)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*2000), "ns/key")
}

// BenchmarkReserveEvict16 reserves and commits 16 new keys into a full pool.
func BenchmarkReserveEvict16(b *testing.B) {
	st, _ := filledState(b, 16384)
	fresh := benchKeys(16384 + 16*100000)[16384:]
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		job := messages.JobRef{Origin: messages.OriginEngine, ID: messages.JobID(i + 2)}
		off := (i * 16) % (len(fresh) - 16)
		r, err := st.Reserve(job, fresh[off:off+16])
		if err != nil {
			b.Fatal(err)
		}
		if err := st.Commit(job, r.ToStore, true, make([]uint32, len(r.ToStore))); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVictimWalkPastHeldSlots is the LRU's walk from its cold end
// past 512 leased blocks (a node whose engines are loading its oldest
// blocks) to the first evictable one, in a full pool of 20,000 slots,
// each walk after a neighbour's 8 MiB sweep (kvtierd shares its cores'
// caches with the engines between calls); only the walks are timed.
// "marks" is the walk evictOne does (State.canEvict); its baseline in the
// same run, "slots", asks isEvictable, reading each slot as the walk did
// before the marks. "marks/slots" is the ratio.
func BenchmarkVictimWalkPastHeldSlots(b *testing.B) {
	const slots, held = 20000, 512
	st, keys := filledState(b, slots)
	holder := messages.Holder{Origin: messages.OriginEngine, ID: "loading"}
	st.LookupAndLease(holder, keys[:held], false, time.Hour) // the oldest: committed first
	l := &st.policy.(*lru).l
	neighbour := make([]byte, 8<<20)
	walk := func(evictable func(int) bool) (d time.Duration) {
		for i := range b.N {
			for j := 0; j < len(neighbour); j += 64 {
				neighbour[j] = byte(i)
			}
			start := time.Now()
			v, ok := l.lastEvictable(evictable)
			d += time.Since(start)
			if !ok || v != held {
				b.Fatalf("walk found %d (%v), want slot %d", v, ok, held)
			}
		}
		return d
	}
	b.ResetTimer()
	marks := walk(func(i int) bool { return st.canEvict[i] })
	baseline := walk(st.isEvictable)
	b.StopTimer()
	b.ReportMetric(float64(marks.Nanoseconds())/float64(b.N), "marks-ns/walk")
	b.ReportMetric(float64(baseline.Nanoseconds())/float64(b.N), "slots-ns/walk")
	b.ReportMetric(float64(marks)/float64(baseline), "marks/slots")
}

// compactKey is a messages.Key with a hash of up to 32 bytes held inline:
// what a fixed-size key would make the index's map key. It exists only for
// BenchmarkIndexKeyShape.
type compactKey struct {
	ns   messages.Namespace
	hash [4]uint64
	long string // a hash over 32 bytes, whole
	n    uint8
	g    uint32
}

func compactOf(k messages.Key) compactKey {
	c := compactKey{ns: k.Namespace, n: uint8(len(k.Hash)), g: k.Group}
	if len(k.Hash) > 32 {
		c.long = k.Hash
		return c
	}
	var b [32]byte
	copy(b[:], k.Hash)
	for i := range c.hash {
		c.hash[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return c
}

// BenchmarkIndexKeyShape asks whether a fixed-size key would make the
// index cheaper: the same random lookups, by keys decoded afresh (their
// hashes in strings of their own, as a call's are; compact ones converted
// beforehand, as a decoder would make them), in a map keyed by
// messages.Key and in one keyed by compactKey, timed in alternating
// batches of the same run. Reports ns per lookup of each and their ratio.
func BenchmarkIndexKeyShape(b *testing.B) {
	for _, n := range []int{20000, 200000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			keys := benchKeys(n)
			byKey, byCompact := make(map[messages.Key]int, n), make(map[compactKey]int, n)
			asked, askedCompact := make([]messages.Key, n), make([]compactKey, n)
			for i, k := range keys {
				byKey[k], byCompact[compactOf(k)] = i, i
				asked[i] = messages.Key{Namespace: k.Namespace, Hash: string([]byte(k.Hash))}
				askedCompact[i] = compactOf(asked[i])
			}
			order := rand.New(rand.NewPCG(1, 2)).Perm(n)
			const batch = 1024
			var tKey, tCompact time.Duration
			sum, at, first := 0, 0, false
			for b.Loop() {
				idx := order[at : at+batch]
				if at += batch; at+batch > n {
					at = 0
				}
				viaKey := func() time.Duration {
					start := time.Now()
					for _, i := range idx {
						sum += byKey[asked[i]]
					}
					return time.Since(start)
				}
				viaCompact := func() time.Duration {
					start := time.Now()
					for _, i := range idx {
						sum += byCompact[askedCompact[i]]
					}
					return time.Since(start)
				}
				// NB: the second pass finds the asked keys in cache: the
				// order alternates so that neither shape always gets it.
				if first = !first; first {
					tKey += viaKey()
					tCompact += viaCompact()
				} else {
					tCompact += viaCompact()
					tKey += viaKey()
				}
			}
			lookups := float64(b.N * batch)
			b.ReportMetric(float64(tKey.Nanoseconds())/lookups, "ns/key-lookup")
			b.ReportMetric(float64(tCompact.Nanoseconds())/lookups, "ns/compact-lookup")
			b.ReportMetric(float64(tCompact)/float64(tKey), "compact/key")
			if sum < 0 {
				b.Fatal(sum)
			}
		})
	}
}
