package modeltime

import (
	"fmt"
	"testing"
)

// Run drives a seeded model test: for each seed below seeds, a subtest
// named for it makes a world of the seed, takes steps random steps in it,
// then settles it (delivers what is left and checks the world is empty).
func Run[W any](t *testing.T, seeds uint64, steps int, world func(*testing.T, uint64) W, step, settle func(W)) {
	t.Helper()
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			w := world(t, seed)
			for range steps {
				step(w)
			}
			settle(w)
		})
	}
}

// Take removes the i-th element of *s (a queue of calls in flight, say)
// and returns it; the rest keep their order, so a seed replays the same.
func Take[T any](s *[]T, i int) T {
	v := (*s)[i]
	*s = append((*s)[:i], (*s)[i+1:]...)
	return v
}
