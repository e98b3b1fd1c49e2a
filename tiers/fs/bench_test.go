package fs

import (
	"crypto/rand"
	"hash/crc32"
	"path/filepath"
	"testing"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
)

func benchKey(i int) messages.Key {
	return messages.Key{Namespace: "0123456789abcdef", Hash: string([]byte{byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i), 1, 2, 3, 4})}
}

func BenchmarkStoreWriteRead256K(b *testing.B) {
	s := NewStore(OS{}, b.TempDir(), false)
	src := make([]byte, 256<<10)
	_, _ = rand.Read(src)
	sum := crc32.Checksum(src, blockfmt.Castagnoli)
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
	entry := entrySize(FileSize(len(src), nil) - int64(len(src)))
	base := entriesFor(DefaultSegmentBytes, int64(len(src)), entry)
	where := func(i int) recordWrite { // as segLog reserves it: 256 blocks a 64 MiB segment
		return recordWrite{id: uint64(1 + i/256), header: i%256 == 0, dataBase: base,
			off: segHeaderSize + int64(i%256)*entry, size: entry, data: base + int64(i%256)*int64(len(src))}
	}
	b.Run("segment-write", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for i := range b.N {
			if err := s.writeRecord(where(i), benchKey(i), src, sum, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("segment-read", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		dst := make([]byte, len(src))
		for i := range b.N {
			w := where(i % 1000)
			at := storedAt{path: s.segPath(w.id), keep: true, off: w.off, data: w.data}
			if _, _, err := s.readAt(at, benchKey(i%1000), dst); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("crc", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for range b.N {
			crc32.Checksum(src, blockfmt.Castagnoli)
		}
	})
}

// BenchmarkRecordWriteShapes writes 256 KiB blocks one after another into
// one file, as a segment takes them, in the shapes a record could have:
// the block alone at block-size-aligned offsets (the raw baseline's shape);
// the block with a record header (96 bytes, as blockfmt's) in front, in one
// pwritev (the segment layout's); the same with the header padded to 4 KiB
// (the block page-aligned but not block-aligned); and the block at a
// block-aligned offset with its header written apart, into a header area
// at the file's start (two pwrites). What the difference shows is ext4's
// large folios: a write covering whole, naturally aligned large folios is
// cheaper per byte than one that straddles them, whatever its header.
func BenchmarkRecordWriteShapes(b *testing.B) {
	src := make([]byte, 256<<10)
	_, _ = rand.Read(src)
	const headerArea = 2 << 20 // room for 4,096 headers of 96 bytes before the first block
	bs := int64(len(src))
	for _, shape := range []struct {
		name  string
		write func(f File, hdr []byte, i int64) error
	}{
		{"block-alone", func(f File, _ []byte, i int64) error { return writeAtv(f, [][]byte{src}, i*bs) }},
		{"header-unaligned", func(f File, hdr []byte, i int64) error {
			return writeAtv(f, [][]byte{hdr[:96], src}, i*(96+bs))
		}},
		{"header-page-aligned", func(f File, hdr []byte, i int64) error {
			return writeAtv(f, [][]byte{hdr, src}, i*(4096+bs))
		}},
		{"header-apart-block-aligned", func(f File, hdr []byte, i int64) error {
			if err := writeAtv(f, [][]byte{hdr[:96]}, i*96); err != nil {
				return err
			}
			return writeAtv(f, [][]byte{src}, headerArea+i*bs)
		}},
	} {
		b.Run(shape.name, func(b *testing.B) {
			f, err := OS{}.OpenWrite(filepath.Join(b.TempDir(), "seg"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			hdr := make([]byte, 4096)
			b.SetBytes(bs)
			for i := range b.N {
				if err := shape.write(f, hdr, int64(i%4096)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
