package bench

import (
	"math"
	"slices"
)

// Figures on a shared 2-core machine drift as other work comes and goes.
// A ratio between two conditions (busy vs idle, tier vs raw) is therefore
// measured in interleaved pairs — A B, B A, A B, … — so that drift hits
// both sides alike, and reported as the ratio of the medians with the
// spread of the per-pair ratios.

// quantile is xs's q-quantile (nearest rank on the sorted samples).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[int(math.Round(float64(len(s)-1)*q))]
}

func median(xs []float64) float64 { return quantile(xs, 0.5) }

// percentileMs is xs's p-percentile, rounding the rank down.
func percentileMs(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}

// spread is the interquartile range of xs relative to its median: 0.1
// means the middle half of the samples lies within ±5 % of the median.
func spread(xs []float64) float64 {
	m := median(xs)
	if m == 0 {
		return 0
	}
	return (quantile(xs, 0.75) - quantile(xs, 0.25)) / m
}

// pairRatios are b[i]/a[i] for each interleaved pair.
func pairRatios(a, b []float64) []float64 {
	out := make([]float64, 0, min(len(a), len(b)))
	for i := range min(len(a), len(b)) {
		if a[i] > 0 {
			out = append(out, b[i]/a[i])
		}
	}
	return out
}

// ratioSpread is the half-width of the interquartile range of the
// per-pair ratios b[i]/a[i]: the ± to read beside median(b)/median(a).
func ratioSpread(a, b []float64) float64 {
	r := pairRatios(a, b)
	return (quantile(r, 0.75) - quantile(r, 0.25)) / 2
}

// settled reports whether n more pairs would hardly move the ratio of
// medians: it moved by at most tol over the last two pairs.
func settled(a, b []float64, tol float64) bool {
	n := min(len(a), len(b))
	if n < 4 {
		return false
	}
	now := median(b[:n]) / median(a[:n])
	before := median(b[:n-2]) / median(a[:n-2])
	return math.Abs(now-before) <= tol
}
