package messages

import "errors"

// Standalone mode: the engine endpoint (scheduler/endpoint.go) serves the
// manager API to out-of-process engines. These are the errors only the wire
// can produce, and the one bridge message the endpoint needs beyond the
// manager calls.

// Errors of the engine protocol (docs/PROTOCOL.md). A client maps the wire's
// error codes back to these and to the sentinels of errors.go, so errors.Is
// works the same through a socket as in process.
var (
	// ErrBadRequest: a frame the endpoint could not decode, or a field of the
	// wrong type, out of bounds, unknown or missing.
	ErrBadRequest = errors.New("kvtier: malformed request")
	// ErrProtocolVersion: the request's protocol version is not served; or,
	// in a client, the daemon's Hello names a version the client does not
	// speak.
	ErrProtocolVersion = errors.New("kvtier: unsupported protocol version")
	// ErrUnknownOp: the request names an operation the endpoint does not know.
	ErrUnknownOp = errors.New("kvtier: unknown operation")
	// ErrNoSession: the connection has no live session (no Hello yet, or its
	// session expired after the grace period and everything it held was
	// released). Say Hello again.
	ErrNoSession = errors.New("kvtier: no engine session")
	// ErrBusy: too many calls of this connection are in flight, or too many
	// of its requests are open (no request_finished yet).
	ErrBusy = errors.New("kvtier: too many calls in flight")
	// ErrInternal: the endpoint failed in a way the caller cannot fix.
	ErrInternal = errors.New("kvtier: internal error")
	// ErrBadReply: a client received a reply it could not decode, or one
	// that names a slot outside the pool it mapped.
	ErrBadReply = errors.New("kvtier: malformed reply")
)

// ReleaseSession ends everything an engine connection held, after the
// endpoint declared it gone (its grace period passed with no frame, or it
// said Hello again or Bye). Every request id of the session starts with
// Prefix, which the endpoint gives each session and no other session shares.
type ReleaseSession struct {
	Prefix string   // request ids of the session start with this
	Open   []string // request ids that may still hold leases (no RequestFinished yet)
	Reply  Reply[SessionReleased]
}

// SessionReleased answers ReleaseSession. Once it is answered, every CPU-tier
// release it caused is queued ahead of any later call.
type SessionReleased struct {
	Requests int // requests whose leases were released
	Jobs     int // in-flight jobs of the session that were reaped
}
