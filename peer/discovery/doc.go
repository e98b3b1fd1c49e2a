// Package discovery is kvtier's fleet membership on etcd: a node registers
// itself as <prefix>nodes/<node_id> (a JSON Member: control address, data
// plane, namespaces, pool geometry, protocol version, start time) under a
// lease it keeps alive, and watches the prefix for the other members,
// reporting them as plain Events (Joined, Left) to one subscriber.
//
// It owns: its etcd client, its lease and key, the two goroutines that keep
// them (registration with keep-alive; list then watch), and its view of the
// members. It never touches peer sessions, sockets or the handshake: etcd
// says where a node is, the peer handshake (secret, allow-list) says who
// it is, and the node turns Events into messages for the peer plane. It
// never blocks a caller on etcd beyond its configured Timeout.
//
// etcd failures are not kvtier failures. Start fails only when etcd
// answers that another live node holds this node's id (ErrDuplicateNode);
// an unreachable etcd is retried in the background with backoff. A member
// leaves the view only on a delete (a graceful close or an expired lease)
// observed while etcd answers, or when a fresh listing after an outage no
// longer has it: a member is never reported Left because etcd went away.
// When etcd comes back, the node registers again under a new lease,
// taking over its own key if it survived, and lists the prefix again.
//
// Timers here are wall-clock: leases expire on etcd's clock, which no
// injected clock of the node reaches.
package discovery
