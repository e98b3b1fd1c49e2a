package events

import (
	"testing"
)

// FuzzDecodeBatch: any bytes decode or fail with ErrMalformed, never panic
// or run away; whatever decodes re-encodes and decodes to the same batch
// (when it is in the form we publish).
func FuzzDecodeBatch(f *testing.F) {
	g := uint32(1)
	seed := Batch{TS: 1, HasDPRank: true, Events: []Event{
		{Type: TypeBlockStored, BlockHashes: []Hash{{Int: 1}}, TokenIDs: []int32{1, 2}, BlockSize: 2, Medium: "CPU", GroupIdx: &g},
		{Type: TypeBlockRemoved, BlockHashes: []Hash{{Bytes: []byte{1}, IsBytes: true}}, Medium: "CPU"},
		{Type: TypeAllBlocksCleared},
	}}
	p, err := EncodeBatch(&seed)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(p)
	f.Add([]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90})
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := DecodeBatch(payload)
		if err != nil {
			return
		}
		again, err := EncodeBatch(b)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if _, err := DecodeBatch(again); err != nil {
			t.Fatalf("re-decode of a decoded batch: %v", err)
		}
	})
}
