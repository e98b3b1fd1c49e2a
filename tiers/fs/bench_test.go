package fs

import (
	"crypto/rand"
	"hash/crc32"
	"testing"

	"github.com/kvtier/kvtier/messages"
)

func benchKey(i int) messages.Key {
	return messages.Key{Namespace: "0123456789abcdef", Hash: string([]byte{byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i), 1, 2, 3, 4})}
}

func BenchmarkStoreWriteRead256K(b *testing.B) {
	s := NewStore(OS{}, b.TempDir(), false)
	src := make([]byte, 256<<10)
	_, _ = rand.Read(src)
	sum := crc32.Checksum(src, castagnoli)
	b.SetBytes(int64(len(src)))
	b.Run("write", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for i := range b.N {
			if _, err := s.Write(benchKey(i), src, sum, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("read", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		dst := make([]byte, len(src))
		for i := range b.N {
			if _, _, err := s.Read(benchKey(i%1000), dst); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("crc", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for range b.N {
			crc32.Checksum(src, castagnoli)
		}
	})
}
