package blockfmt

import (
	"encoding/binary"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

var k = messages.Key{Namespace: "0123abcd", Hash: strings.Repeat("h", 32), Group: 3}

func prov() *messages.Provenance {
	return &messages.Provenance{ParentHash: []byte(strings.Repeat("p", 32)), TokenIDs: []int32{1, -2, 1 << 30, 7},
		BlockSize: 4, LoRAID: -9, LoRAName: "lora-a", ExtraKeys: []string{"mm:abc", "", "salt"}}
}

func TestPrefixRoundTripsHeaderAndProvenance(t *testing.T) {
	pre, dropped := Prefix(k, 4096, 0xdeadbeef, prov())
	require.False(t, dropped)
	h, err := Decode(pre)
	require.NoError(t, err)
	assert.Equal(t, Header{Key: k, Length: 4096, Sum: 0xdeadbeef, ProvLen: len(pre) - HeaderSize}, h)
	assert.Equal(t, ProvenanceSize(prov()), h.ProvLen)
	assert.Equal(t, int64(len(pre)+4096), h.Size())
	assert.Equal(t, int64(len(pre)), h.BlockOffset())
	got, err := DecodeProvenance(pre[HeaderSize:])
	require.NoError(t, err)
	assert.Equal(t, prov(), got)
	require.NoError(t, h.Check(k, 4096))
	assert.True(t, SizeFits(h.Size(), 4096))

	// No provenance: an empty section, nil back.
	pre, dropped = Prefix(k, 10, 1, nil)
	require.False(t, dropped)
	require.Len(t, pre, HeaderSize)
	h, err = Decode(pre)
	require.NoError(t, err)
	assert.Zero(t, h.ProvLen)
	got, err = DecodeProvenance(nil)
	require.NoError(t, err)
	assert.Nil(t, got)

	// Minimal provenance: empty slices decode as nil.
	pre, _ = Prefix(k, 10, 1, &messages.Provenance{BlockSize: 16})
	got, err = DecodeProvenance(pre[HeaderSize:])
	require.NoError(t, err)
	assert.Equal(t, &messages.Provenance{BlockSize: 16}, got)
}

// A sound copy read into a destination of another length is ErrSize (the
// caller's mistake, the copy kept), never ErrInvalidBlock (the copy removed);
// another key is ErrInvalidBlock.
func TestCheckTellsSizeFromDamage(t *testing.T) {
	pre, _ := Prefix(k, 12288, 1, prov())
	h, err := Decode(pre)
	require.NoError(t, err)
	require.NoError(t, h.Check(k, 12288))
	require.NoError(t, h.Check(k, AnyLength))
	err = h.Check(k, 4096)
	require.ErrorIs(t, err, ErrSize)
	require.ErrorIs(t, err, messages.ErrBadRequest)
	require.NotErrorIs(t, err, messages.ErrInvalidBlock)
	other := k
	other.Group++
	require.ErrorIs(t, h.Check(other, 12288), messages.ErrInvalidBlock)
	require.ErrorIs(t, h.Check(other, AnyLength), messages.ErrInvalidBlock)

	require.NoError(t, CheckLength(1, 4096))
	require.NoError(t, CheckLength(4096, 4096))
	require.ErrorIs(t, CheckLength(0, 4096), ErrSize)
	require.ErrorIs(t, CheckLength(4097, 4096), ErrSize)

	assert.True(t, Fits(h.Size(), 12288))
	assert.True(t, Fits(HeaderSize+1, 12288))
	assert.False(t, Fits(HeaderSize, 12288))
	assert.False(t, Fits(HeaderSize+MaxProvenance+12289, 12288))
}

func TestOversizedProvenanceIsLeftOut(t *testing.T) {
	p := prov()
	p.TokenIDs = make([]int32, messages.MaxProvenanceTokens+1)
	pre, dropped := Prefix(k, 10, 1, p)
	assert.True(t, dropped)
	assert.Len(t, pre, HeaderSize)

	// The largest provenance the bounds allow fits MaxProvenance exactly.
	big := &messages.Provenance{ParentHash: make([]byte, messages.MaxHashBytes),
		TokenIDs: make([]int32, messages.MaxProvenanceTokens), LoRAName: strings.Repeat("n", messages.MaxLoRANameBytes)}
	for range messages.MaxExtraKeys {
		big.ExtraKeys = append(big.ExtraKeys, strings.Repeat("e", messages.MaxExtraKeyBytes))
	}
	assert.Equal(t, MaxProvenance, ProvenanceSize(big))
	pre, dropped = Prefix(k, 10, 1, big)
	require.False(t, dropped)
	h, err := Decode(pre)
	require.NoError(t, err)
	_, err = DecodeProvenance(pre[HeaderSize : HeaderSize+h.ProvLen])
	require.NoError(t, err)
}

// v1 is a version 1 header as the previous format wrote it.
func v1(key messages.Key, length int64, sum uint32) []byte {
	dst := make([]byte, HeaderSize)
	copy(dst, "KVTB")
	binary.LittleEndian.PutUint16(dst[4:], 1)
	dst[6], dst[7] = byte(len(key.Namespace)), byte(len(key.Hash))
	binary.LittleEndian.PutUint32(dst[8:], key.Group)
	binary.LittleEndian.PutUint64(dst[12:], uint64(length))
	binary.LittleEndian.PutUint32(dst[20:], sum)
	copy(dst[24:88], key.Namespace)
	copy(dst[88:152], key.Hash)
	binary.LittleEndian.PutUint32(dst[152:], crc32.Checksum(dst[:152], Castagnoli))
	return dst
}

func TestVersion1HeadersAreStillRead(t *testing.T) {
	h, err := Decode(v1(k, 512, 42))
	require.NoError(t, err)
	assert.Equal(t, Header{Key: k, Length: 512, Sum: 42}, h)
	assert.Equal(t, int64(HeaderSize+512), h.Size())

	bad := v1(k, 512, 42)
	bad[156] = 1 // a v1 header's reserved bytes are outside its checksum: still refused
	_, err = Decode(bad)
	require.ErrorIs(t, err, messages.ErrInvalidBlock)
}

func TestCorruptHeadersAndSectionsAreInvalid(t *testing.T) {
	pre, _ := Prefix(k, 4096, 7, prov())
	for i := range len(pre) {
		bad := append([]byte(nil), pre...)
		bad[i] ^= 0x10
		h, err := Decode(bad)
		if err == nil {
			_, err = DecodeProvenance(bad[HeaderSize : HeaderSize+h.ProvLen])
		}
		if err == nil {
			t.Fatalf("byte %d flipped: not detected", i) // every byte is under a checksum
		}
		require.ErrorIs(t, err, messages.ErrInvalidBlock, "byte %d", i)
	}
	_, err := DecodeProvenance(pre[HeaderSize : len(pre)-1])
	require.ErrorIs(t, err, messages.ErrInvalidBlock, "truncated section")

	// A section whose CRC is right but whose counts lie is refused by bounds.
	sec := make([]byte, 4, 64)
	sec = append(sec, provVersion, 0)
	sec = binary.LittleEndian.AppendUint32(sec, 16)
	sec = binary.LittleEndian.AppendUint64(sec, 0)
	sec = binary.LittleEndian.AppendUint16(sec, 0)
	sec = binary.LittleEndian.AppendUint32(sec, 1<<30) // a billion tokens
	binary.LittleEndian.PutUint32(sec, crc32.Checksum(sec[4:], Castagnoli))
	_, err = DecodeProvenance(sec)
	require.ErrorIs(t, err, messages.ErrInvalidBlock)
}

func FuzzDecodeProvenance(f *testing.F) {
	pre, _ := Prefix(k, 1, 1, prov())
	f.Add(pre[HeaderSize:])
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodeProvenance(b)
		if err != nil {
			return
		}
		// Whatever decodes is within bounds and re-encodes to the same bytes.
		require.NoError(t, p.Validate())
		if p != nil {
			require.Equal(t, b, appendProvenance(nil, p))
		}
	})
}
