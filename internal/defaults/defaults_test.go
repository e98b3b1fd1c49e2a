package defaults

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type clock interface{ Now() time.Time }

type wall struct{}

func (wall) Now() time.Time { return time.Time{} }

type inner struct{ A int }

type config struct {
	Name    string
	N       int
	N64     int64
	U       uint
	F       float64
	D       time.Duration
	On      bool
	Clock   clock
	Inner   inner
	Keys    []string
	NoDef   int
	private int
}

func full() config {
	return config{Name: "n", N: 7, N64: 8, U: 9, F: 1.5, D: time.Second, On: true,
		Clock: wall{}, Inner: inner{A: 3}, Keys: []string{"k"}}
}

func TestFillSetsZeroFields(t *testing.T) {
	c := config{}
	Fill(&c, full())
	require.Equal(t, full(), c)
}

func TestFillKeepsSetFields(t *testing.T) {
	set := config{Name: "x", N: 1, N64: 2, U: 3, F: 0.5, D: time.Minute, On: true,
		Clock: wall{}, Inner: inner{A: 4}, Keys: []string{"y"}, NoDef: 5, private: 6}
	c := set
	Fill(&c, full())
	require.Equal(t, set, c)
}

func TestFillKeepsNegativeValues(t *testing.T) {
	c := config{N: -1, N64: -2, F: -0.5, D: -time.Second}
	Fill(&c, full())
	require.Equal(t, -1, c.N)
	require.Equal(t, int64(-2), c.N64)
	require.Equal(t, -0.5, c.F)
	require.Equal(t, -time.Second, c.D)
}

func TestFillNonPositiveReplacesNegativeValues(t *testing.T) {
	c := config{N: -1, N64: -2, F: -0.5, D: -time.Second, NoDef: -3}
	FillNonPositive(&c, full())
	require.Equal(t, 7, c.N)
	require.Equal(t, int64(8), c.N64)
	require.Equal(t, 1.5, c.F)
	require.Equal(t, time.Second, c.D)
	require.Equal(t, -3, c.NoDef, "a field with no default is left alone, negative or not")

	c = config{N: 2, D: time.Millisecond}
	FillNonPositive(&c, full())
	require.Equal(t, 2, c.N)
	require.Equal(t, time.Millisecond, c.D)
}

func TestFillPanicsOnMisuse(t *testing.T) {
	require.PanicsWithValue(t, "defaults: int is not a struct", func() {
		n := 0
		Fill(&n, 1)
	})
	require.PanicsWithValue(t, "defaults: defaults.config.private is unexported", func() {
		Fill(&config{}, config{private: 1})
	})
}
