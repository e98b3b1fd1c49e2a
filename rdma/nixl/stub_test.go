//go:build !nixl || !cgo

package nixl

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/rdma"
)

func TestStubIsUnavailable(t *testing.T) {
	if Built {
		t.Fatal("stub build says Built")
	}
	tr, err := New(Config{Library: "/whatever/libnixl_capi.so"})
	if tr != nil || !errors.Is(err, rdma.ErrUnavailable) || !strings.Contains(err.Error(), "built without -tags nixl") {
		t.Fatalf("New: %v, %v", tr, err)
	}
	if _, err := Probe(Config{}); !errors.Is(err, rdma.ErrUnavailable) {
		t.Fatalf("Probe: %v", err)
	}
}
