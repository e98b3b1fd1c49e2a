package messages

// Standalone mode: the engine endpoint (scheduler/endpoint.go) serves the
// manager API to out-of-process engines. These are the errors only the wire
// can produce, and the one bridge message the endpoint needs beyond the
// manager calls.

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
