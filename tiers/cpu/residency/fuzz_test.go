package residency

import (
	"encoding/binary"
	"errors"
	"testing"
	"unsafe"
)

// FuzzParse: whatever the bytes, parse returns an error or a reader whose
// lookups stay in bounds (an out-of-bounds index would panic here).
func FuzzParse(f *testing.F) {
	good, regions := image(f, 16, 64, 8)
	regions[0].Publish(Fingerprint("ns", sha("0"), 0), StateCPU)
	f.Add(append([]byte(nil), good...))
	f.Add(append([]byte(nil), good[:tableStart+64]...)) // truncated: regions past the end
	f.Add(append([]byte(nil), good[:40]...))            // truncated header
	f.Fuzz(func(t *testing.T, data []byte) {
		rd, err := newReader(aligned(data))
		if err != nil {
			if !errors.Is(err, ErrBadIndex) {
				t.Fatalf("error %v is not ErrBadIndex", err)
			}
			return
		}
		for i := 0; i+8 <= len(data); i += 8 {
			rd.State(binary.LittleEndian.Uint64(data[i:]))
		}
		for _, fp := range []uint64{4, 1<<64 - 1, 0xdeadbeef << 32} {
			rd.State(fp)
		}
	})
}

// aligned copies data into 8-byte aligned memory, as a mapping would be.
func aligned(data []byte) []byte {
	if len(data) == 0 {
		return nil
	}
	words := make([]uint64, (len(data)+7)/8)
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(data))
	copy(mem, data)
	return mem
}
