package obj

import (
	"context"
	"io"

	"github.com/kvtier/kvtier/supervision"
)

// Op names a Client call, for fault rules.
type Op uint8

// Client calls.
const (
	OpPut Op = iota + 1
	OpGet
	OpHead
	OpRemove
	OpProbe
)

// Rule decides a call's fault: nil lets it through. It may block (a stalled
// endpoint) but should watch ctx.
type Rule func(ctx context.Context, op Op, name string) error

// Faulty wraps a Client and fails or stalls calls by rule (chaos tests).
type Faulty struct {
	inner Client
	rules supervision.Rules[Rule]
}

// NewFaulty wraps inner.
func NewFaulty(inner Client) *Faulty { return &Faulty{inner: inner} }

// Inject adds a rule; the returned func removes it.
func (f *Faulty) Inject(r Rule) (remove func()) { return f.rules.Inject(r) }

func (f *Faulty) check(ctx context.Context, op Op, name string) error {
	for _, r := range f.rules.Active() {
		if err := r(ctx, op, name); err != nil {
			return err
		}
	}
	return nil
}

// Put implements Client.
func (f *Faulty) Put(ctx context.Context, name string, body io.Reader, size int64) error {
	if err := f.check(ctx, OpPut, name); err != nil {
		return err
	}
	return f.inner.Put(ctx, name, body, size)
}

// Get implements Client.
func (f *Faulty) Get(ctx context.Context, name string) (io.ReadCloser, int64, error) {
	if err := f.check(ctx, OpGet, name); err != nil {
		return nil, 0, err
	}
	return f.inner.Get(ctx, name)
}

// Head implements Client.
func (f *Faulty) Head(ctx context.Context, name string) (int64, error) {
	if err := f.check(ctx, OpHead, name); err != nil {
		return 0, err
	}
	return f.inner.Head(ctx, name)
}

// Remove implements Client.
func (f *Faulty) Remove(ctx context.Context, name string) error {
	if err := f.check(ctx, OpRemove, name); err != nil {
		return err
	}
	return f.inner.Remove(ctx, name)
}

// Probe implements Client.
func (f *Faulty) Probe(ctx context.Context) error {
	if err := f.check(ctx, OpProbe, ""); err != nil {
		return err
	}
	return f.inner.Probe(ctx)
}

// Close implements Client.
func (f *Faulty) Close() { f.inner.Close() }
