package messages

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// Place gives each key its first position in the call, whichever way it
// searches (key by key for a short call, through a map for a long one):
// checked against the definition on random calls that name keys twice and
// leave some keys out.
func TestPlaceFindsEachKeysFirstPositionInShortAndLongCalls(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	key := func(i int) Key { return Key{Namespace: "ns", Hash: fmt.Sprintf("%04d", i)} }
	for _, n := range []int{1, 5, placeScanMax, placeScanMax + 1, 200} {
		for range 50 {
			call := make([]Key, n)
			for i := range call {
				call[i] = key(rng.IntN(n + n/4 + 1)) // some named twice
			}
			keys := make([]Key, rng.IntN(n)+1)
			for i := range keys {
				keys[i] = key(rng.IntN(n + n/2 + 1)) // some not in the call
			}
			got := Place(call, keys, []byte("parent"))
			for i, k := range keys {
				first := -1
				for p, c := range call {
					if c == k {
						first = p
						break
					}
				}
				want := Placement{Index: first}
				switch {
				case first == 0:
					want.Parent = "parent"
				case first > 0:
					want.Parent = call[first-1].Hash
				}
				require.Equal(t, want, got[i], "call of %d, key %d", n, i)
			}
		}
	}
}
