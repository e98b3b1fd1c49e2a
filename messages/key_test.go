package messages

import (
	"errors"
	"strings"
	"testing"
)

func TestNamespaceSeparatesEveryLayoutField(t *testing.T) {
	base := Layout{Model: "m", Revision: "r", DType: "fp16", KVLayout: "NHD", BlockTokens: 16, TPRank: 0, TPSize: 2, CacheSalt: ""}
	variants := []Layout{base}
	for _, f := range []func(*Layout){
		func(l *Layout) { l.Model = "m2" },
		func(l *Layout) { l.Revision = "r2" },
		func(l *Layout) { l.DType = "fp8" },
		func(l *Layout) { l.KVLayout = "HND" },
		func(l *Layout) { l.BlockTokens = 32 },
		func(l *Layout) { l.TPRank = 1 },
		func(l *Layout) { l.TPSize = 4 },
		func(l *Layout) { l.CacheSalt = "tenant-a" },
		// Concatenation must not collide: "m"+"r" vs "mr"+"".
		func(l *Layout) { l.Model, l.Revision = "mr", "" },
	} {
		l := base
		f(&l)
		variants = append(variants, l)
	}
	seen := map[Namespace]int{}
	for i, l := range variants {
		ns := l.Namespace()
		if len(ns) != 16 {
			t.Fatalf("namespace %q: want 16 hex characters", ns)
		}
		if j, dup := seen[ns]; dup {
			t.Fatalf("layouts %d and %d share namespace %s", j, i, ns)
		}
		seen[ns] = i
	}
	// Pinned: namespaces name fs directories and object prefixes that
	// outlive a process, so the derivation must never drift.
	again := Layout{Model: "m", Revision: "r", DType: "fp16", KVLayout: "NHD", BlockTokens: 16, TPSize: 2}
	if got := again.Namespace(); got != "574fc05fb4278461" || got != base.Namespace() {
		t.Fatalf("namespace of the base layout drifted: %s", got)
	}
}

func TestKeyValidate(t *testing.T) {
	if err := (Key{Hash: "x"}).Validate(); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"", strings.Repeat("x", MaxHashBytes+1)} {
		if err := (Key{Hash: h}).Validate(); !errors.Is(err, ErrBadKey) {
			t.Fatalf("hash of %d bytes: %v, want ErrBadKey", len(h), err)
		}
	}
}

func TestReplyAnswersOnceWithoutBlocking(t *testing.T) {
	r := NewReply[int]()
	r.Answer(1, nil)
	r.Answer(2, errors.New("second")) // dropped, never blocks
	got := <-r.C()
	if got.Value != 1 || got.Err != nil {
		t.Fatalf("got %+v", got)
	}
}

func TestReplyFuncIsCalledWithTheAnswer(t *testing.T) {
	var got []Result[int]
	r := ReplyFunc(func(res Result[int]) { got = append(got, res) })
	r.Answer(3, nil)
	if len(got) != 1 || got[0].Value != 3 || got[0].Err != nil || r.C() != nil {
		t.Fatalf("got %+v", got)
	}
	Reply[int]{}.Answer(4, nil) // the zero Reply discards, never blocks
}
