package cede

import "testing"

func withCountedYields(t *testing.T) *int {
	t.Helper()
	n := 0
	old := yield
	yield = func() { n++ }
	t.Cleanup(func() { yield = old })
	return &n
}

func TestBudgetYieldsOncePerEvery(t *testing.T) {
	yields := withCountedYields(t)
	b := Budget{Every: 1 << 20}
	for range 14 { // 3.5 MiB in 256 KiB steps
		b.Spent(256 << 10)
	}
	if *yields != 3 {
		t.Fatalf("yields after 3.5 MiB with Every 1 MiB = %d, want 3", *yields)
	}
}

func TestBudgetZeroValueUsesDefault(t *testing.T) {
	yields := withCountedYields(t)
	var b Budget
	b.Spent(DefaultEvery - 1)
	if *yields != 0 {
		t.Fatalf("yielded before DefaultEvery bytes")
	}
	b.Spent(1)
	if *yields != 1 {
		t.Fatalf("yields at DefaultEvery bytes = %d, want 1", *yields)
	}
}

func TestBudgetLargeStepYieldsOnce(t *testing.T) {
	yields := withCountedYields(t)
	b := Budget{Every: 4096}
	b.Spent(1 << 20) // one block larger than Every: one yield, not 256
	b.Spent(4095)
	if *yields != 1 {
		t.Fatalf("yields = %d, want 1", *yields)
	}
}
