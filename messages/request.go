package messages

// ReqContext is the request a call is made for. It is carried by every
// message that starts work and by the job that finishes it, so that events
// are built from the exact context of the job that produced them: the
// pointer's identity, not the request id (ids may be reused by the engine).
type ReqContext struct {
	RequestID string // engine request id; holder of this request's leases

	// Transfer parameters.
	Workers     int      // worker reports each job of this request expects; 0 = node default
	TierFilter  []string // tiers this request may load from (vLLM kv_load_tiers); empty = all
	PeerSources []string // peers (node ids) this request may fetch from (vLLM remote_kv_source); empty = every ready peer
	BlockBytes  int      // the slots its stores take: its engine session's geometry; 0 = the pool's first (set by the endpoint, never sent by an engine)

	// Provenance for KV events (vLLM BlockStored fields).
	ParentBlockHash []byte   // hash of the block before the first key of the call; nil at the start of a prompt
	TokenIDs        []int32  // token ids of the blocks of the call, concatenated
	BlockSize       int      // tokens per block
	LoRAID          int      // LoRA adapter id; 0 = none
	LoRAName        string   // LoRA adapter name; "" = none
	ExtraKeys       []string // extra hash inputs (multimodal hashes, cache salt)
	SpecKind        string   // KV-cache spec kind of the blocks' group (vLLM 0.33 KVCacheSpecKind, e.g. "full_attention"); "" = unknown
	SlidingWindow   int      // the group's sliding window in tokens; 0 = none
	SessionID       string   // the session the request belongs to (vLLM 0.33 session_id); "" = none
}

// Holder returns the lease holder that stands for this request.
func (r *ReqContext) Holder() Holder {
	return Holder{Origin: OriginEngine, ID: r.RequestID}
}

// Origin says who a lease, pin or reservation was taken for.
type Origin uint8

const (
	OriginEngine Origin = iota + 1 // the local engine, through the bridge
	OriginTier                     // a secondary tier (cascade read, promotion write)
	OriginPeer                     // a remote peer's round
	// OriginCredit owns an engine session's slot credit (JobRef.ID is the
	// session's number): slots reserved ahead of its stores. A bridge
	// restart does not release it (the session outlives the bridge); the
	// session's end does, after a quarantine.
	OriginCredit
)

// Holder owns leases: an engine request, a peer round.
type Holder struct {
	Origin Origin // who took the lease
	ID     string // request id, or a peer round's id
}

// JobID numbers transfer jobs; never reused within a node's life.
//
// Ranges, so that owners numbering jobs independently never collide under
// one Origin: the bridge numbers engine jobs from 1; the tiering actor
// numbers its promotion and cascade jobs (OriginTier) from TieringJobBase;
// the CPU tier numbers its own verification pins (OriginTier) from
// VerifyJobBase.
type JobID uint64

// Job id ranges (see JobID).
const (
	TieringJobBase JobID = 1 << 62
	VerifyJobBase  JobID = 3 << 62
)

// JobRef owns pins and write reservations in the CPU tier.
type JobRef struct {
	Origin Origin // engine, tier or peer
	ID     JobID  // job id
}

// LookupStatus is the answer for one key of a Lookup.
type LookupStatus uint8

const (
	Miss       LookupStatus = iota // not in any tier this node can reach now
	Hit                            // readable now, leased to the request until PrepareLoad
	HitPending                     // a write (store or promotion) of it is in flight
	Retry                          // not known yet; a slower lookup was started: ask again next step
)

func (s LookupStatus) String() string {
	switch s {
	case Miss:
		return "MISS"
	case Hit:
		return "HIT"
	case HitPending:
		return "HIT_PENDING"
	case Retry:
		return "RETRY"
	}
	return "UNKNOWN"
}

// JobKind is the direction of an engine transfer job.
type JobKind uint8

const (
	JobLoad  JobKind = iota + 1 // CPU slots → GPU
	JobStore                    // GPU → CPU slots
)

func (k JobKind) String() string {
	switch k {
	case JobLoad:
		return "load"
	case JobStore:
		return "store"
	}
	return "unknown"
}

// LoadJob is what PrepareLoad hands the engine: the slots to copy from and
// the job its workers report on.
type LoadJob struct {
	ID      JobID // report completion with JobDone(ID, worker, ok)
	Slots   []int // slot index per key, in the order of the keys
	Workers int   // worker reports the job expects
}

// StorePlan is what PrepareStore hands the engine.
type StorePlan struct {
	Job     JobID // 0 when ToStore is empty
	ToStore []Key // keys not yet present, in call order; the engine copies these
	Slots   []int // slot per ToStore key
	Evicted []Key // keys evicted to make room (announced as removed)
	Workers int   // worker reports the job expects
}
