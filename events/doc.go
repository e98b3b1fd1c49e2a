// Package events publishes a node's KV events in vLLM's wire format so that
// KV-aware routers (llm-d, Dynamo, Mooncake Conductor) can send requests to
// where the cache is (docs/PROTOCOL.md, "KV events").
//
// It owns three things and nothing else:
//   - the translation of tier events (messages.Event) into wire events, with
//     the per-medium inventory that decides when a block is new to a medium
//     and when its last copy there went away, and the writes in flight that
//     hold a block back until its parent is announced (Translator, pure
//     logic);
//   - the hub actor that batches wire events, numbers batches and hands them
//     to the publisher without ever blocking its mailbox (Hub);
//   - the ZeroMQ sockets: a PUB socket and a replay ROUTER socket, each
//     owned by goroutines that block on their inputs, with a bounded replay
//     buffer and a bounded shutdown flush (Publisher);
//
// plus a decoder of the wire format (Decode) for `kvtier events tail`.
// Tiers are handed the hub's PID through their Props when the node spawns
// them.
//
// It must not touch tier state: tiers announce events by sending them to
// the hub; the hub never asks a tier anything.
package events
