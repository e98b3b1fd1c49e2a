//go:build !nixl || !cgo

package nixl

import (
	"fmt"

	"github.com/kvtier/kvtier/rdma"
)

// Built reports whether this binary carries the NIXL transport (built with
// -tags nixl and cgo).
const Built = false

// New returns an error wrapping rdma.ErrUnavailable: this binary was built
// without -tags nixl (or without cgo).
func New(cfg Config) (rdma.Transport, error) {
	return nil, fmt.Errorf("nixl: built without -tags nixl (and cgo): %w", rdma.ErrUnavailable)
}

// Probe reports whether the NIXL library named by cfg can be loaded and
// drive an agent here. In this build it always fails with rdma.ErrUnavailable.
func Probe(cfg Config) (Info, error) {
	_, err := New(cfg)
	return Info{}, err
}
