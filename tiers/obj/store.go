package obj

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
)

// readChunk is the unit a block is read and checksummed in.
const readChunk = 64 << 10

// errShortBody: the object ended before header + block (or went on past it).
var errShortBody = errors.New("kvtier obj: object body of unexpected length")

// Store does one block's S3 I/O per call, on a worker goroutine, never in
// the actor: it formats and verifies blocks; the actor decides which calls
// to make.
type Store struct {
	c      Client
	prefix string
}

// Name is k's object name: the prefix, then blockfmt.RelPath(k).
func (s *Store) Name(k messages.Key) string { return s.prefix + blockfmt.RelPath(k) }

// Write checks src against sum and PUTs header, provenance p (nil: none)
// and block as k's object.
func (s *Store) Write(ctx context.Context, k messages.Key, src []byte, sum uint32, p *messages.Provenance) error {
	if got := crc32.Checksum(src, blockfmt.Castagnoli); got != sum {
		return fmt.Errorf("%w: %v: slot has %08x, committed %08x", messages.ErrChecksum, k, got, sum)
	}
	prefix, _ := blockfmt.Prefix(k, len(src), sum, p)
	body := io.MultiReader(bytes.NewReader(prefix), bytes.NewReader(src))
	return s.c.Put(ctx, s.Name(k), body, int64(len(prefix)+len(src)))
}

// Read GETs k's object into dest and verifies it: header intact, same key,
// length len(dest), provenance section intact, CRC32C as recorded, object
// size exactly header + provenance + block. It returns the checksum and the
// stored provenance (nil when the object has none). A copy that fails a
// check (its size included) is ErrInvalidBlock; a missing one ErrNotFound;
// a body cut short by the network errShortBody (transient); a sound copy of
// another length than len(dest) blockfmt.ErrSize, dest untouched (the
// header is checked before a byte of the block is read).
func (s *Store) Read(ctx context.Context, k messages.Key, dest []byte) (uint32, *messages.Provenance, error) {
	body, size, err := s.c.Get(ctx, s.Name(k))
	if err != nil {
		return 0, nil, err
	}
	defer body.Close()
	if !blockfmt.Fits(size, blockfmt.MaxBlockBytes) {
		return 0, nil, fmt.Errorf("%w: %v: object of %d bytes, no stored block's size", messages.ErrInvalidBlock, k, size)
	}
	var hdr [blockfmt.HeaderSize]byte
	if _, err := io.ReadFull(body, hdr[:]); err != nil {
		return 0, nil, shortOr(k, "header", err)
	}
	h, err := blockfmt.Decode(hdr[:])
	if err != nil {
		return 0, nil, fmt.Errorf("%v: %w", k, err)
	}
	// NB: the object's own consistency first: a copy that is damaged is
	// invalid whatever the destination.
	if h.Size() != size {
		return 0, nil, fmt.Errorf("%w: %v: object of %d bytes, its header says %d", messages.ErrInvalidBlock, k, size, h.Size())
	}
	if err := h.Check(k, len(dest)); err != nil {
		return 0, nil, err
	}
	section := make([]byte, h.ProvLen)
	if _, err := io.ReadFull(body, section); err != nil {
		return 0, nil, shortOr(k, "provenance", err)
	}
	p, err := blockfmt.DecodeProvenance(section)
	if err != nil {
		return 0, nil, fmt.Errorf("%v: %w", k, err)
	}
	// NB: checksum each chunk while it is still in cache.
	var got uint32
	for off := 0; off < len(dest); off += readChunk {
		chunk := dest[off:min(off+readChunk, len(dest))]
		if _, err := io.ReadFull(body, chunk); err != nil {
			return 0, nil, shortOr(k, "block", err)
		}
		got = crc32.Update(got, blockfmt.Castagnoli, chunk)
	}
	var extra [1]byte
	if n, _ := body.Read(extra[:]); n > 0 {
		return 0, nil, fmt.Errorf("%w: %v: object longer than its header says", messages.ErrInvalidBlock, k)
	}
	if got != h.Sum {
		return 0, nil, fmt.Errorf("%w: %v: %w: want %08x, got %08x", messages.ErrInvalidBlock, k, messages.ErrChecksum, h.Sum, got)
	}
	return h.Sum, p, nil
}

// shortOr: the object's length was right, so a body that ends early was cut
// by the network (transient), not stored short.
func shortOr(k messages.Key, what string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("obj get %v: %s: %w: %w", k, what, errShortBody, err)
	}
	return fmt.Errorf("obj get %v: %s: %w", k, what, err)
}

// Head reports whether k's object exists with a size a block of 1 to
// maxBlock bytes can have (header, provenance within its bound, block).
func (s *Store) Head(ctx context.Context, k messages.Key, maxBlock int) (bool, error) {
	size, err := s.c.Head(ctx, s.Name(k))
	if errors.Is(err, messages.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return blockfmt.Fits(size, maxBlock), nil
}

// Remove deletes k's object; a missing one is not an error.
func (s *Store) Remove(ctx context.Context, k messages.Key) error {
	return s.c.Remove(ctx, s.Name(k))
}
