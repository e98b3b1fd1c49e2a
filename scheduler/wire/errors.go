package wire

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/messages"
)

// Code is a wire error code: a short upper-case string (docs/PROTOCOL.md).
type Code string

// The wire's error codes. Each names one sentinel error.
const (
	CodeFull         Code = "FULL"
	CodeUnknownKey   Code = "UNKNOWN_KEY"
	CodeNotPending   Code = "NOT_PENDING"
	CodeNotLoading   Code = "NOT_LOADING"
	CodeUnknownJob   Code = "UNKNOWN_JOB"
	CodeBadWorker    Code = "BAD_WORKER"
	CodeBadKey       Code = "BAD_KEY"
	CodePaused       Code = "PAUSED"
	CodeClosed       Code = "CLOSED"
	CodeBadConfig    Code = "BAD_CONFIG"
	CodeChecksum     Code = "CHECKSUM"
	CodeBadRequest   Code = "BAD_REQUEST"
	CodeBadVersion   Code = "BAD_VERSION"
	CodeUnknownOp    Code = "UNKNOWN_OP"
	CodeNoSession    Code = "NO_SESSION"
	CodeBusy         Code = "BUSY"
	CodeSizing       Code = "SIZING"
	CodeTimeout      Code = "TIMEOUT"
	CodeInternal     Code = "INTERNAL"
	maxErrorMsgBytes      = 4096
)

// codes pairs each code with its sentinel, in the order errors are matched
// (the first sentinel an error wraps wins).
var codes = []struct {
	code Code
	err  error
}{
	{CodeFull, messages.ErrFull},
	{CodeUnknownKey, messages.ErrUnknownKey},
	{CodeNotPending, messages.ErrNotPending},
	{CodeNotLoading, messages.ErrNotLoading},
	{CodeUnknownJob, messages.ErrUnknownJob},
	{CodeBadWorker, messages.ErrBadWorker},
	{CodeBadKey, messages.ErrBadKey},
	{CodePaused, messages.ErrPaused},
	{CodeClosed, messages.ErrClosed},
	{CodeBadConfig, messages.ErrBadConfig},
	{CodeChecksum, messages.ErrChecksum},
	{CodeBadRequest, messages.ErrBadRequest},
	{CodeBadVersion, messages.ErrProtocolVersion},
	{CodeUnknownOp, messages.ErrUnknownOp},
	{CodeNoSession, messages.ErrNoSession},
	{CodeBusy, messages.ErrBusy},
	{CodeSizing, messages.ErrSizing},
	{CodeTimeout, context.DeadlineExceeded},
	{CodeInternal, messages.ErrInternal},
}

// CodeOf is the wire code of err: the first sentinel it wraps, else INTERNAL.
func CodeOf(err error) Code {
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return CodeInternal
}

// ErrorOf turns a wire error back into an error that wraps the code's
// sentinel, with the server's message as context. An unknown code (a newer
// server) wraps ErrInternal and keeps the code in the text.
func ErrorOf(code Code, msg string) error {
	for _, c := range codes {
		if c.code == code {
			return &RemoteError{Code: code, Msg: msg, sentinel: c.err}
		}
	}
	return &RemoteError{Code: code, Msg: msg, sentinel: messages.ErrInternal}
}

// RemoteError is an error answered by the daemon.
type RemoteError struct {
	Code     Code   // wire code
	Msg      string // the daemon's message (already includes the sentinel's text)
	sentinel error
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("kvtierd: %s (%s)", e.Msg, e.Code)
}

// Unwrap makes errors.Is(err, messages.ErrFull) and friends work.
func (e *RemoteError) Unwrap() error { return e.sentinel }

// DecodeError is a request the endpoint could not decode. HasID says
// whether ID is the request's id (the frame was readable that far).
type DecodeError struct {
	Code  Code   // BAD_REQUEST, BAD_VERSION or UNKNOWN_OP
	ID    uint64 // the request id, when HasID
	HasID bool
	Op    string // the op name, when read
	Msg   string
}

func (e *DecodeError) Error() string { return fmt.Sprintf("%s: %s", e.Code, e.Msg) }

// Unwrap maps the code to its sentinel.
func (e *DecodeError) Unwrap() error {
	for _, c := range codes {
		if c.code == e.Code {
			return c.err
		}
	}
	return messages.ErrBadRequest
}
