package messages

// What the node reports of its peers (the stats API). The protocol between
// the P2P tier, the peer sessions and the control plane is peer/peermsg's;
// the batched read a promotion from peers is, tiers/tiermsg's.

// PeerStats are one peer's counters, as seen by this node.
type PeerStats struct {
	Node       string `json:"node"`
	Ready      bool   `json:"ready"`       // outbound session ready (we can fetch from it)
	Serving    bool   `json:"serving"`     // inbound session ready (we serve it)
	Lookups    uint64 `json:"lookups"`     // keys we asked it for
	Hits       uint64 `json:"hits"`        // keys it had
	Fetched    uint64 `json:"fetched"`     // blocks fetched and verified
	FetchBytes uint64 `json:"fetch_bytes"` // bytes fetched
	Failures   uint64 `json:"failures"`    // rounds that failed (timeout, refused, corrupt, gone)
	Corrupt    uint64 `json:"corrupt"`     // blocks that failed their checksum
	Served     uint64 `json:"served"`      // blocks we wrote into its pool
	FetchNanos uint64 `json:"fetch_ns"`    // total fetch latency, for a mean
	Fetches    uint64 `json:"fetches"`     // fetch rounds completed
	Resets     uint64 `json:"resets"`      // times its ready outbound session was lost
}
