package residency

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
	"unsafe"
)

// ErrBadIndex: the bytes are not a valid residency index (short, foreign,
// corrupt, or of another version). Readers get it wrapped with the detail.
var ErrBadIndex = errors.New("kvtier: bad residency index")

// ErrBadCapacity: Create was asked for a layout the format cannot hold.
var ErrBadCapacity = errors.New("kvtier: bad residency index capacity")

// MaxRegions is how many regions one index file holds.
const MaxRegions = 4

const (
	magic            = "KVTRES01"
	version          = 1
	headerSize       = 64
	descSize         = 32
	maxRegions       = MaxRegions
	tableStart       = headerSize + descSize*maxRegions // 192: already a multiple of bucketBytes
	bucketBytes      = 64
	entriesPerBucket = 8
	maxBuckets       = 1 << 31 // the largest power of two a u32 holds
)

// Descriptor field offsets, relative to the descriptor.
const (
	descOffset    = 0
	descBuckets   = 8
	descEntries   = 12
	descPublished = 16
	descOverflow  = 24
)

// span is where one region's buckets lie in the file.
type span struct {
	offset   uint64
	nbuckets uint64
}

func (s span) end() uint64 { return s.offset + s.nbuckets*bucketBytes }

// bucketsFor sizes a region for capacity keys at a load of at most one half:
// the next power of two >= ceil(capacity/4), at least 1.
func bucketsFor(capacity int) (uint64, error) {
	if capacity < 0 {
		return 0, fmt.Errorf("%w: negative capacity %d", ErrBadCapacity, capacity)
	}
	n := (uint64(capacity) + 3) / 4
	if n <= 1 {
		return 1, nil
	}
	if n > maxBuckets {
		return 0, fmt.Errorf("%w: capacity %d needs more than %d buckets", ErrBadCapacity, capacity, maxBuckets)
	}
	return 1 << bits.Len64(n-1), nil
}

// plan lays out one region per capacity, back to back after the
// descriptors, and returns the file size.
func plan(capacities []int) ([]span, int, error) {
	if len(capacities) < 1 || len(capacities) > maxRegions {
		return nil, 0, fmt.Errorf("%w: %d regions, want 1..%d", ErrBadCapacity, len(capacities), maxRegions)
	}
	spans := make([]span, len(capacities))
	next := uint64(tableStart)
	for i, c := range capacities {
		n, err := bucketsFor(c)
		if err != nil {
			return nil, 0, err
		}
		spans[i] = span{offset: next, nbuckets: n}
		next = spans[i].end()
	}
	// NB: 4 regions of at most 2^31 buckets of 64 bytes stay far below 2^63.
	return spans, int(next), nil
}

// format writes the header and descriptors into zeroed, 8-byte aligned mem
// and returns a Region per span. The magic goes in last, with an atomic
// store, so a reader that sees it sees a complete header.
func format(mem []byte, spans []span, generation uint64) []*Region {
	le := binary.LittleEndian
	le.PutUint32(mem[8:], version)
	le.PutUint32(mem[12:], uint32(len(spans)))
	le.PutUint64(mem[16:], generation)
	regions := make([]*Region, len(spans))
	for i, s := range spans {
		d := mem[headerSize+descSize*i:]
		le.PutUint64(d[descOffset:], s.offset)
		le.PutUint32(d[descBuckets:], uint32(s.nbuckets))
		le.PutUint32(d[descEntries:], entriesPerBucket)
		regions[i] = &Region{
			table:     newTable(mem[s.offset:s.end()], s.nbuckets),
			published: word(d[descPublished:]),
			overflow:  word(d[descOverflow:]),
		}
	}
	atomic.StoreUint64(word(mem), le.Uint64([]byte(magic)))
	return regions
}

// parse validates an index image and returns its generation and one table
// per region. It reads only inside mem, whatever mem holds: it is fuzzed.
func parse(mem []byte) (uint64, []table, error) {
	if len(mem) < tableStart {
		return 0, nil, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrBadIndex, len(mem), tableStart)
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(mem)))%8 != 0 {
		return 0, nil, fmt.Errorf("%w: image not 8-byte aligned", ErrBadIndex)
	}
	n, err := parseHeader(mem)
	if err != nil {
		return 0, nil, err
	}
	spans := make([]span, n)
	for i := range spans {
		if spans[i], err = parseDescriptor(mem, i); err != nil {
			return 0, nil, err
		}
	}
	if err := checkDisjoint(spans); err != nil {
		return 0, nil, err
	}
	tables := make([]table, n)
	for i, s := range spans {
		tables[i] = newTable(mem[s.offset:s.end()], s.nbuckets)
	}
	return binary.LittleEndian.Uint64(mem[16:]), tables, nil
}

// parseHeader checks magic, version and region count.
func parseHeader(mem []byte) (int, error) {
	if string(mem[:8]) != magic {
		return 0, fmt.Errorf("%w: magic %q, want %q", ErrBadIndex, mem[:8], magic)
	}
	if v := binary.LittleEndian.Uint32(mem[8:]); v != version {
		return 0, fmt.Errorf("%w: version %d, want %d", ErrBadIndex, v, version)
	}
	n := binary.LittleEndian.Uint32(mem[12:])
	if n < 1 || n > maxRegions {
		return 0, fmt.Errorf("%w: %d regions, want 1..%d", ErrBadIndex, n, maxRegions)
	}
	return int(n), nil
}

// parseDescriptor checks descriptor i and that its region lies inside mem.
func parseDescriptor(mem []byte, i int) (span, error) {
	le := binary.LittleEndian
	d := mem[headerSize+descSize*i:]
	s := span{offset: le.Uint64(d[descOffset:]), nbuckets: uint64(le.Uint32(d[descBuckets:]))}
	switch {
	case s.offset%bucketBytes != 0 || s.offset < tableStart:
		return span{}, fmt.Errorf("%w: region %d at offset %d", ErrBadIndex, i, s.offset)
	case s.nbuckets == 0 || s.nbuckets&(s.nbuckets-1) != 0:
		return span{}, fmt.Errorf("%w: region %d has %d buckets, not a power of two", ErrBadIndex, i, s.nbuckets)
	case le.Uint32(d[descEntries:]) != entriesPerBucket:
		return span{}, fmt.Errorf("%w: region %d has %d entries per bucket, want %d", ErrBadIndex, i, le.Uint32(d[descEntries:]), entriesPerBucket)
	// NB: compare against the room left, so a huge offset cannot wrap.
	case s.offset > uint64(len(mem)) || s.nbuckets*bucketBytes > uint64(len(mem))-s.offset:
		return span{}, fmt.Errorf("%w: region %d (%d buckets at %d) past the end of %d bytes", ErrBadIndex, i, s.nbuckets, s.offset, len(mem))
	}
	return s, nil
}

// checkDisjoint rejects regions that share bytes: a reader of one would see
// another's entries as its own.
func checkDisjoint(spans []span) error {
	for i := range spans {
		for j := i + 1; j < len(spans); j++ {
			if spans[i].offset < spans[j].end() && spans[j].offset < spans[i].end() {
				return fmt.Errorf("%w: regions %d and %d overlap", ErrBadIndex, i, j)
			}
		}
	}
	return nil
}

// word is the u64 at the start of b. REQUIRES: b 8-byte aligned, len >= 8.
func word(b []byte) *uint64 {
	return (*uint64)(unsafe.Pointer(unsafe.SliceData(b[:8])))
}
