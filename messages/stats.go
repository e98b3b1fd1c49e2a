package messages

import "time"

// Stats is a snapshot of a node's counters and gauges.
type Stats struct {
	// Pool geometry and occupancy (gauges). With several geometries the
	// slot counts are of every geometry together; Geometries has each.
	Slots          int             // slots with memory behind them
	BlockBytes     int             // bytes per slot of the pool's first geometry
	PoolBytes      int64           // the budget every geometry's slots share
	CommittedBytes int64           // bytes of the slots with memory behind them (≤ PoolBytes)
	UsedBytes      int64           // bytes of the slots not free (write-pending, credited or ready)
	Geometries     []GeometryStats // one per block size served, the first geometry first
	Free           int             // free slots
	WritePending   int             // slots being written
	Credit         int             // slots reserved ahead for engine sessions' stores (slot credit), not being written yet
	Ready          int             // readable slots
	Pinned         int             // slots with at least one read pin
	Leased         int             // slots with at least one live lease
	Leases         int             // live leases
	JobsInFlight   int             // engine jobs awaiting worker reports
	Requests       int             // requests with state at the bridge
	Paused         bool            // engine intake stopped

	// Counters since start.
	Lookups          uint64 // keys looked up
	Hits             uint64 // keys answered HIT
	HitsPending      uint64 // keys answered HIT_PENDING
	Misses           uint64 // keys answered MISS
	Stores           uint64 // keys committed readable
	StoresFailed     uint64 // reserved keys freed by a failed or reaped store
	Evictions        uint64 // blocks evicted to make room
	Full             uint64 // PrepareStore calls answered Full
	LeasesExpired    uint64 // leases that ran out before PrepareLoad
	JobsCompleted    uint64 // engine jobs completed by worker reports or Complete* calls
	JobsReapedLoad   uint64 // load jobs reaped at their deadline
	JobsReapedStore  uint64 // store jobs reaped at their deadline
	LateReports      uint64 // worker reports for unknown, finished or reaped jobs
	ChecksumFailures uint64 // verifications that found wrong bytes
	ActorRestarts    uint64 // supervised actor restarts
	// SessionOpen is, in an engine session's stats reply, how many of its
	// request ids hold something until their request_finished (0 elsewhere).
	SessionOpen int
	// SessionCalls is, in an engine session's stats reply, how many of its
	// calls sent before the stats call are still being served (noreply and
	// quiet ones too; 0 elsewhere): 0 means each has taken effect.
	SessionCalls int
	// Sessions is, in an engine session's stats reply, how many engine
	// sessions the daemon holds, the calling one included (0 elsewhere).
	Sessions int
	// Engines is, in an engine session's stats reply, every engine session
	// the daemon holds, the calling one included, oldest first (nil
	// elsewhere).
	Engines []EngineSession
}

// EngineSession is what a daemon knows of one engine session (`kvtier
// status`).
type EngineSession struct {
	ID         uint64    // the session's number
	Client     string    // the name its hello gave
	Topic      string    // the topic of its own KV events its hello gave; "" = none
	Namespace  Namespace // the key namespace of its latest keyed call; "" before one
	BlockBytes int       // the bytes per block its hello declared; 0 = none
	Since      time.Time // when its hello was heard
	Calls      uint64    // calls it made
	Lookups    uint64    // keys it looked up
	Hits       uint64    // of those, answered HIT
	Open       int       // its request ids holding something until request_finished
	InFlight   int       // its calls the daemon has not answered yet (noreply and quiet ones too)
}

// GeometryStats is one block size's share of the pool.
type GeometryStats struct {
	BlockBytes int // bytes per slot
	Slots      int // slots it may use (as many as the budget holds)
	Committed  int // slots with memory behind them
	Free       int // of those, free
	Ready      int // slots holding a readable block
}
