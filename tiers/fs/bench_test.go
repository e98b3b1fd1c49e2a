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

// BenchmarkRecordWriteShapes writes 256 KiB blocks one after another into
// one file, as a segment takes them, in the shapes a record could have:
// the block alone (the raw baseline's shape), and the block with a record
// header (96 bytes, as blockfmt's) in one pwritev, unaligned (the segment
// layout's) and with the header padded to 4 KiB so the block is
// page-aligned. What the header costs ext4 per write is the difference.
func BenchmarkRecordWriteShapes(b *testing.B) {
	src := make([]byte, 256<<10)
	_, _ = rand.Read(src)
	for _, shape := range []struct {
		name string
		hdr  int
	}{{"block-alone", 0}, {"header-unaligned", 96}, {"header-page-aligned", 4096}} {
		b.Run(shape.name, func(b *testing.B) {
			f, err := OS{}.OpenWrite(filepath.Join(b.TempDir(), "seg"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			bufs := [][]byte{make([]byte, shape.hdr), src}
			if shape.hdr == 0 {
				bufs = bufs[1:]
			}
			rec := int64(shape.hdr + len(src))
			b.SetBytes(int64(len(src)))
			for i := range b.N {
				if err := writeAtv(f, bufs, int64(i%4096)*rec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
