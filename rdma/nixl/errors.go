package nixl

import (
	"fmt"
)

// Status is a nixl_capi_status_t value.
type Status int

// The C API's status codes (NIXL 1.x).
const (
	StatusSuccess      Status = 0
	StatusInProgress   Status = 1
	StatusInvalidParam Status = -1
	StatusBackend      Status = -2
	StatusInvalidState Status = -3
	StatusException    Status = -4
	StatusNoTelemetry  Status = -5
	StatusNotFound     Status = -6
)

func (s Status) String() string {
	switch s {
	case StatusSuccess:
		return "success"
	case StatusInProgress:
		return "in progress"
	case StatusInvalidParam:
		return "invalid parameter"
	case StatusBackend:
		return "backend error"
	case StatusInvalidState:
		return "invalid state"
	case StatusException:
		return "exception"
	case StatusNoTelemetry:
		return "no telemetry"
	case StatusNotFound:
		return "not found"
	}
	return fmt.Sprintf("status %d", int(s))
}

// Error is a failed NIXL C API call. It wraps the rdma error that says what
// the failure means for the caller (ErrUnavailable at start-up, ErrPeerGone
// for a transfer, ErrProtocol for metadata NIXL refused).
type Error struct {
	Op     string // the C function, without its nixl_capi_ prefix
	Status Status
	Kind   error // an rdma sentinel
}

func (e *Error) Error() string {
	return fmt.Sprintf("nixl: %s: %s (%d): %v", e.Op, e.Status, int(e.Status), e.Kind)
}

func (e *Error) Unwrap() error { return e.Kind }
