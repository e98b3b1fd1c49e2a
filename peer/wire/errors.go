package wire

import (
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/internal/msgp"
)

// Sentinels. Every error Encode and Decode return is an *Error that wraps
// exactly one of ErrMalformed and ErrVersion; ErrTooLarge and ErrUnknownOp
// refine ErrMalformed (errors.Is(err, ErrMalformed) holds for them too).
var (
	// ErrMalformed: the frame is not a valid frame of this protocol version
	// (not msgpack, truncated, trailing bytes, a wrong type, a missing,
	// unknown or repeated field, an exact length or a consistency rule
	// broken).
	ErrMalformed = errors.New("malformed peer frame")
	// ErrTooLarge: the frame, or a length, count or integer in it, is above
	// its bound. Also wraps ErrMalformed.
	ErrTooLarge = errors.New("peer frame above a bound")
	// ErrUnknownOp: a frame of this version whose "op" is not one of ours.
	// Also wraps ErrMalformed.
	ErrUnknownOp = errors.New("unknown peer frame op")
	// ErrVersion: a frame of another protocol version. For Hello and
	// Welcome, Decode returns the frame's version-stable fields along with
	// it (so the session can answer Refuse{RefuseVersion} naming the node).
	ErrVersion = errors.New("unsupported peer protocol version")
)

// Labels returned by Reason, for the bad-frame counters.
const (
	ReasonMalformed = "malformed"
	ReasonTooLarge  = "too_large"
	ReasonUnknownOp = "unknown_op"
	ReasonVersion   = "version"
	ReasonOther     = "other" // an error not from this package
)

// Reason is a short, fixed label for err, for counters: one of the Reason*
// constants, or "" for nil.
func Reason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrVersion):
		return ReasonVersion
	case errors.Is(err, ErrTooLarge):
		return ReasonTooLarge
	case errors.Is(err, ErrUnknownOp):
		return ReasonUnknownOp
	case errors.Is(err, ErrMalformed):
		return ReasonMalformed
	}
	return ReasonOther
}

// RefuseLabel maps a Refuse.Reason received from a peer to a counter label:
// the reason itself when it is one of the Refuse* constants, else "other".
// Peer-supplied strings never become label values unchecked.
func RefuseLabel(reason string) string {
	switch reason {
	case RefuseVersion, RefuseAuth, RefuseNotAllow, RefuseNamespace,
		RefuseGeometry, RefuseTransport, RefuseBusy, RefuseShutdown:
		return reason
	}
	return ReasonOther
}

// Error is a frame that could not be encoded or decoded.
type Error struct {
	Kind  error  // ErrMalformed, ErrTooLarge, ErrUnknownOp or ErrVersion
	Op    string // the frame's op name, when known ("" otherwise)
	Field string // the field at fault, when one (e.g. "keys", "prov.tokens")
	Msg   string // what was wrong
}

func (e *Error) Error() string {
	where := e.Op
	if e.Field != "" {
		if where != "" {
			where += "."
		}
		where += e.Field
	}
	if where != "" {
		return fmt.Sprintf("peer/wire: %s: %s: %s", Reason(e), where, e.Msg)
	}
	return fmt.Sprintf("peer/wire: %s: %s", Reason(e), e.Msg)
}

// Unwrap makes errors.Is work with the sentinels.
func (e *Error) Unwrap() []error {
	if e.Kind == ErrTooLarge || e.Kind == ErrUnknownOp {
		return []error{e.Kind, ErrMalformed}
	}
	return []error{e.Kind}
}

// fieldErr turns a reader or check error about field into an *Error,
// classifying bound errors as ErrTooLarge.
func fieldErr(op, field string, err error) *Error {
	if e, ok := err.(*Error); ok {
		if e.Op == "" {
			e.Op = op
		}
		if field != "" {
			if e.Field != "" {
				e.Field = field + "." + e.Field
			} else {
				e.Field = field
			}
		}
		return e
	}
	kind := ErrMalformed
	var b *msgp.BoundError
	if errors.As(err, &b) {
		kind = ErrTooLarge
	}
	return &Error{Kind: kind, Op: op, Field: field, Msg: err.Error()}
}

func malformed(op, field, format string, a ...any) *Error {
	return &Error{Kind: ErrMalformed, Op: op, Field: field, Msg: fmt.Sprintf(format, a...)}
}

func tooLarge(op, field, format string, a ...any) *Error {
	return &Error{Kind: ErrTooLarge, Op: op, Field: field, Msg: fmt.Sprintf(format, a...)}
}
