package wire

// Version is the peer protocol version this build speaks. A peer that
// offers another one is refused (RefuseVersion) and counted. Version 3
// carries blocks of any size (LookupResp and Fetch name each block's
// length: "sizes"), and block_bytes is a slot's capacity, no longer
// required equal on both sides; version 2 sealed every frame after the
// handshake (seal.go); version 1 did not.
const Version = 3

// Bounds every decoder enforces before it allocates.
const (
	MaxKeys        = 8192 // keys in one Lookup / Fetch
	MaxNodeIDBytes = 128
	MaxNamespaces  = 64
	MaxMetaBytes   = 64 << 10 // data-plane metadata in the handshake
	MaxFrameBytes  = 8 << 20  // a whole encoded frame
	MaxTokenIDs    = 4096     // token ids of one block's provenance
	MaxExtraKeys   = 64
	MaxStringBytes = 1024 // reason, LoRA name, namespace, extra key
	NonceBytes     = 32
	MACBytes       = 32 // HMAC-SHA256
	TokenBytes     = 16
	MaxFetchTTLms  = 600_000 // a Fetch's ttl: 10 minutes
)

// Frame is one decoded control-plane frame: one of the types below.
type Frame interface{ frame() }

// Key is a block key on the wire (messages.Key).
type Key struct {
	Namespace string // layout namespace
	Hash      []byte // block hash, 1..messages.MaxHashBytes bytes
	Group     uint32 // KV-cache group
}

// Hello opens a session: sent by the dialing side (the consumer of this
// direction) on its DEALER.
type Hello struct {
	Version    int      // protocol version of the sender
	Node       string   // sender's node id (also its DEALER identity)
	Epoch      uint64   // random per session incarnation; frames of another epoch are dropped
	Nonce      []byte   // NonceBytes random bytes, for the challenge-response
	Namespaces []string // namespaces the sender shares; empty = any
	BlockBytes int      // sender's pool geometry: a slot's bytes, the largest block it holds
	Slots      int
	Transport  string // data-plane kind: "tcp" | "nixl"
	DataMeta   []byte // the sender's rdma.Transport.Metadata()
}

// Welcome answers Hello: the listening side's half of the handshake, with
// its proof of the shared secret.
type Welcome struct {
	Version    int
	Node       string
	Epoch      uint64 // echoes Hello.Epoch: the session's epoch
	Nonce      []byte // the listener's nonce
	Namespaces []string
	BlockBytes int
	Slots      int
	Transport  string
	DataMeta   []byte
	MAC        []byte // ServerMAC over both halves
}

// Auth completes the handshake: the dialer's proof of the shared secret.
type Auth struct {
	Epoch uint64
	MAC   []byte // ClientMAC over both halves
}

// Ready confirms the session: rounds may start.
type Ready struct {
	Epoch uint64
}

// Refuse ends a handshake (or a session): the reason is a RefuseReason.
type Refuse struct {
	Epoch  uint64
	Reason string
	Msg    string // human-readable detail, bounded
}

// Refusal reasons (also the label of the refused-peer counter).
const (
	RefuseVersion   = "version"     // protocol version not supported
	RefuseAuth      = "auth"        // wrong MAC
	RefuseNotAllow  = "not_allowed" // node id not on the allow-list
	RefuseNamespace = "namespace"   // no namespace in common
	RefuseGeometry  = "geometry"    // block bytes differ: sent by version 2 only (version 3 carries blocks of any size)
	RefuseTransport = "transport"   // different data-plane kinds
	RefuseBusy      = "busy"        // too many sessions
	RefuseShutdown  = "shutdown"    // the node is stopping
)

// Lookup asks which keys the producer holds, leasing the hits to the round.
type Lookup struct {
	Epoch uint64
	Round uint64 // > every round before it in this session
	Keys  []Key
}

// Provenance is what the producer knows about a block's origin (vLLM
// BlockStored fields), so the consumer's events are as full as its own.
type Provenance struct {
	ParentHash []byte
	TokenIDs   []int32
	BlockSize  int
	LoRAID     int
	LoRAName   string
	ExtraKeys  []string
}

// LookupResp answers Lookup: per key, hit or not; for hits the committed
// CRC32C, the block's length and, when known, provenance.
type LookupResp struct {
	Epoch     uint64
	Round     uint64
	Hits      []bool        // one per Lookup key
	Checksums []uint32      // one per Lookup key (0 for misses)
	Prov      []*Provenance // one per Lookup key, nil when unknown; may be empty
	// Sizes is each hit's length in bytes (0 for misses), one per Lookup
	// key; empty means the producer's BlockBytes for every hit.
	Sizes []int
}

// Fetch asks the producer to write leased hits of Round into the
// consumer's slots, under a one-time data-plane token.
type Fetch struct {
	Epoch uint64
	Round uint64
	Keys  []Key // subset of the round's hits
	Dest  []int // consumer slot per key (within the consumer's advertised Slots)
	// Sizes is each block's length in bytes, one per key, as the
	// LookupResp said; empty means the consumer's BlockBytes for every key.
	// Both sides cut the Fetch into chunks from these (peer/chunks.go).
	Sizes []int
	Token []byte
	// TTLms is how long, in milliseconds from its arrival, the consumer
	// waits for this Fetch (1..MaxFetchTTLms): the producer posts no write
	// for it later (TransferDone{reason: "expired"}), so that a write
	// never lands in slots a consumer that gave up has reused.
	TTLms uint32
}

// TransferDone is the producer's end of a Fetch.
type TransferDone struct {
	Epoch  uint64
	Round  uint64
	OK     bool
	Reason string // why not OK
}

// Abort tells the producer the consumer gave up on Round: its leases end.
type Abort struct {
	Epoch uint64
	Round uint64
}

// AbortAck confirms an Abort: the producer holds nothing of Round.
type AbortAck struct {
	Epoch uint64
	Round uint64
}

// Ping asks for a Pong (liveness while rounds are in flight).
type Ping struct {
	Epoch uint64
	Seq   uint64
}

// Pong answers Ping.
type Pong struct {
	Epoch uint64
	Seq   uint64
}

// Bye ends a session politely (shutdown): in-flight rounds fail at once.
type Bye struct {
	Epoch  uint64
	Reason string
}

func (*Hello) frame()        {}
func (*Welcome) frame()      {}
func (*Auth) frame()         {}
func (*Ready) frame()        {}
func (*Refuse) frame()       {}
func (*Lookup) frame()       {}
func (*LookupResp) frame()   {}
func (*Fetch) frame()        {}
func (*TransferDone) frame() {}
func (*Abort) frame()        {}
func (*AbortAck) frame()     {}
func (*Ping) frame()         {}
func (*Pong) frame()         {}
func (*Bye) frame()          {}
