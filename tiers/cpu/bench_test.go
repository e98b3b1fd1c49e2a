package cpu

import (
	"encoding/binary"
	"fmt"
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
