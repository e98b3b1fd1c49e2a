package fs

import (
	"crypto/rand"
	"hash/crc32"
	"path/filepath"
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
	if err := s.fs.MkdirAll(filepath.Join(s.root, segDirName)); err != nil {
		b.Fatal(err)
	}
	b.Run("segment-write", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		size := FileSize(len(src), nil)
		for i := range b.N {
			id := uint64(1 + i/256) // 64 MiB segments
			off := segHeaderSize + int64(i%256)*size
			if err := s.writeRecord(id, off, i%256 == 0, benchKey(i), src, sum, nil, size); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("segment-read", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		size := FileSize(len(src), nil)
		dst := make([]byte, len(src))
		for i := range b.N {
			j := i % 1000
			if _, _, err := s.readAt(s.segPath(uint64(1+j/256)), true, segHeaderSize+int64(j%256)*size, benchKey(j), dst); err != nil {
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
