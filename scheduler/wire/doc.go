// Package wire is the codec of the engine protocol (docs/PROTOCOL.md, "Engine
// protocol"): how an out-of-process engine's manager calls and the daemon's
// replies are framed as msgpack maps on the engine endpoint's ZeroMQ socket.
//
// It owns the request and reply schemas, their bounds, and the mapping
// between the messages.Err* sentinels and the wire's error codes. It holds
// no state, starts nothing and never touches a socket: the endpoint
// (scheduler) and the clients (scheduler/client, clients/python) do the I/O.
//
// Decoding is strict: every field has one msgpack type, every length and
// integer is bounded before anything is allocated, unknown and repeated
// request fields are refused. A decode error carries the request's id when
// the frame got that far, so the endpoint can answer it.
package wire
