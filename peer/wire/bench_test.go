package wire

import (
	"testing"
)

// go test -run x -bench . -benchmem ./peer/wire
//
// A lookup round of 1,700 keys (32-byte hashes, one 16-byte namespace) and
// its answer, with and without provenance.
const benchKeys = 1700

func benchFrames() map[string]Frame {
	return map[string]Frame{
		"Lookup":         &Lookup{Epoch: 9, Round: 3, Keys: testKeys(benchKeys)},
		"LookupResp":     testResp(benchKeys, false),
		"LookupRespProv": benchRespProv(),
	}
}

// benchRespProv: every key a hit with 16 tokens and its parent, as vLLM's
// events would carry.
func benchRespProv() *LookupResp {
	r := &LookupResp{Epoch: 9, Round: 3, Hits: make([]bool, benchKeys), Checksums: make([]uint32, benchKeys), Prov: make([]*Provenance, benchKeys)}
	for i := range benchKeys {
		tokens := make([]int32, 16)
		for j := range tokens {
			tokens[j] = int32(i*16 + j)
		}
		r.Hits[i], r.Checksums[i] = true, uint32(i)+1
		r.Prov[i] = &Provenance{ParentHash: hash(i - 1), TokenIDs: tokens, BlockSize: 16}
	}
	return r
}

func BenchmarkEncode(b *testing.B) {
	for _, name := range []string{"Lookup", "LookupResp", "LookupRespProv"} {
		f := benchFrames()[name]
		b.Run(name, func(b *testing.B) {
			out, _ := Encode(f)
			b.SetBytes(int64(len(out)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Encode(f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, name := range []string{"Lookup", "LookupResp", "LookupRespProv"} {
		frame, err := Encode(benchFrames()[name])
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Decode(frame); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
