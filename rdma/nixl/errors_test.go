package nixl

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/rdma"
)

func TestErrorWrapsItsKind(t *testing.T) {
	err := error(&Error{Op: "create_backend", Status: StatusBackend, Kind: rdma.ErrUnavailable})
	if !errors.Is(err, rdma.ErrUnavailable) {
		t.Fatalf("%v does not wrap ErrUnavailable", err)
	}
	var ne *Error
	if !errors.As(err, &ne) || ne.Status != StatusBackend {
		t.Fatalf("errors.As: %v", err)
	}
	if !strings.Contains(err.Error(), "create_backend") || !strings.Contains(err.Error(), "backend error") {
		t.Fatalf("message %q lacks the op or status", err)
	}
	if Status(7).String() != "status 7" {
		t.Fatalf("unknown status: %q", Status(7).String())
	}
}
