package wire

import (
	"fmt"
	"math"
	"time"

	"github.com/kvtier/kvtier/messages"
)

// Hello is what a session learns when it begins.
type Hello struct {
	Protocol      int                // protocol version
	Session       uint64             // the session's number, unique in the daemon's life
	PoolPath      string             // shared-memory file of the pool; map it read-write
	BlockBytes    int                // bytes per slot
	Slots         int                // slots in the pool
	Namespace     messages.Namespace // the only namespace keys may use; "" = any
	Heartbeat     time.Duration      // send a frame (ping) at least this often
	Grace         time.Duration      // a session silent this long is released
	MaxKeys       int                // keys per call
	MaxFrameBytes int                // bytes per frame
	JobWorkers    int                // worker reports a job expects by default
	PackedKeys    bool               // the daemon reads "pkeys" (pkeys.go); absent from older daemons
	// IndexPath is the residency index's shared-memory file (read-only for
	// clients: tiers/cpu/residency); "" when the daemon publishes none.
	IndexPath string
	// IndexComplete: the index covers every tier a lookup can find a block
	// in, so a key it lacks is a MISS the engine may answer itself; false
	// when an object tier or peers are configured (ask the daemon).
	IndexComplete bool
	// Credit: the daemon serves grant and store (slot credit for stores).
	Credit bool
	// Batch: the daemon reads batch frames and quiet calls.
	Batch bool
}

// Reply is one answer. Err is set on failure; otherwise the fields of the
// request's op are.
type Reply struct {
	ID       uint64
	Err      *RemoteError
	Status   []messages.LookupStatus // lookup
	Job      messages.JobID          // prepare_load, prepare_store, store
	Slots    []int                   // prepare_load, prepare_store, grant; lookup with want_slots (a HIT's slot, else 0)
	Workers  int                     // prepare_load, prepare_store, store
	ToStore  []messages.Key          // prepare_store
	Evicted  []messages.Key          // prepare_store, grant
	Bound    []bool                  // store: per key, whether its credited slot now holds its write (false: already held)
	Events   []messages.Event        // take_events
	Pending  bool                    // has_pending_work
	Stats    messages.Stats          // stats
	Hello    Hello                   // hello
	Released messages.SessionReleased
}

// EncodeError encodes an error reply for request id.
func EncodeError(id uint64, err error) []byte { return EncodeCallError(id, 0, err) }

// EncodeCallError encodes an error reply for request id of op: the error
// names the op (a quiet call's error is the only reply its caller gets).
// An op of 0 is left out.
func EncodeCallError(id uint64, op Op, err error) []byte {
	w := writer{B: make([]byte, 0, 128)}
	w.MapLen(3)
	w.Str("v")
	w.Uint(Version)
	w.Str("id")
	w.Uint(id)
	w.Str("err")
	if op > 0 && op < opEnd {
		w.MapLen(3)
		w.Str("op")
		w.Str(op.String())
	} else {
		w.MapLen(2)
	}
	w.Str("code")
	w.Str(string(CodeOf(err)))
	msg := err.Error()
	if len(msg) > maxErrorMsgBytes {
		msg = msg[:maxErrorMsgBytes]
	}
	w.Str("msg")
	w.Str(msg)
	return w.B
}

// EncodeReply encodes a successful reply to op (its row of ops says
// which fields). strip is removed from the front of request ids in events
// (the endpoint's session prefix).
func EncodeReply(op Op, rp *Reply, strip func(string) string) []byte {
	w := writer{B: make([]byte, 0, replySizeHint(rp))}
	var shape replyShape
	if op > 0 && op < opEnd {
		shape = ops[op].reply
	}
	n := 0
	if shape.fields != nil {
		n = shape.fields(rp)
	}
	w.MapLen(2 + n)
	w.Str("v")
	w.Uint(Version)
	w.Str("id")
	w.Uint(rp.ID)
	if shape.encode != nil {
		shape.encode(&w, rp, strip)
	}
	return w.B
}

// replySizeHint is about the bytes rp encodes to, key lists included, so
// that a reply is written into one allocation, not grown as it goes.
func replySizeHint(rp *Reply) int {
	return 64 + 16*len(rp.Status) + 8*len(rp.Slots) + len(rp.Bound) +
		keysSizeHint(rp.ToStore) + keysSizeHint(rp.Evicted)
}

// keysSizeHint is about the bytes encodeKeys writes for keys.
func keysSizeHint(keys []messages.Key) int {
	n := 5
	for _, k := range keys {
		n += 16 + len(k.Namespace) + len(k.Hash)
	}
	return n
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

func kvUint(w *writer, k string, v uint64) {
	w.Str(k)
	w.Uint(v)
}

func writeSlots(w *writer, slots []int) {
	w.Str("slots")
	encodeSlots(w, slots)
}

func encodeEvent(w *writer, e *messages.Event, strip func(string) string) {
	w.MapLen(5)
	w.Str("kind")
	w.Str(e.Kind.String())
	w.Str("keys")
	encodeKeys(w, e.Keys)
	w.Str("medium")
	w.Str(e.Medium)
	w.Str("req")
	prefix := ""
	if e.Ctx != nil && strip != nil {
		prefix = e.Ctx.RequestID[:len(e.Ctx.RequestID)-len(strip(e.Ctx.RequestID))]
	}
	encodeReqContext(w, e.Ctx, prefix)
	w.Str("at_ns")
	w.Int(e.At.UnixNano())
}

// statFields names every Stats field on the wire.
var statFields = []struct {
	name string
	ptr  func(*messages.Stats) any // *int, *uint64 or *bool
}{
	{"slots", func(s *messages.Stats) any { return &s.Slots }},
	{"block_bytes", func(s *messages.Stats) any { return &s.BlockBytes }},
	{"free", func(s *messages.Stats) any { return &s.Free }},
	{"write_pending", func(s *messages.Stats) any { return &s.WritePending }},
	{"credit", func(s *messages.Stats) any { return &s.Credit }},
	{"ready", func(s *messages.Stats) any { return &s.Ready }},
	{"pinned", func(s *messages.Stats) any { return &s.Pinned }},
	{"leased", func(s *messages.Stats) any { return &s.Leased }},
	{"leases", func(s *messages.Stats) any { return &s.Leases }},
	{"jobs_in_flight", func(s *messages.Stats) any { return &s.JobsInFlight }},
	{"requests", func(s *messages.Stats) any { return &s.Requests }},
	{"paused", func(s *messages.Stats) any { return &s.Paused }},
	{"lookups", func(s *messages.Stats) any { return &s.Lookups }},
	{"hits", func(s *messages.Stats) any { return &s.Hits }},
	{"hits_pending", func(s *messages.Stats) any { return &s.HitsPending }},
	{"misses", func(s *messages.Stats) any { return &s.Misses }},
	{"stores", func(s *messages.Stats) any { return &s.Stores }},
	{"stores_failed", func(s *messages.Stats) any { return &s.StoresFailed }},
	{"evictions", func(s *messages.Stats) any { return &s.Evictions }},
	{"full", func(s *messages.Stats) any { return &s.Full }},
	{"leases_expired", func(s *messages.Stats) any { return &s.LeasesExpired }},
	{"jobs_completed", func(s *messages.Stats) any { return &s.JobsCompleted }},
	{"jobs_reaped_load", func(s *messages.Stats) any { return &s.JobsReapedLoad }},
	{"jobs_reaped_store", func(s *messages.Stats) any { return &s.JobsReapedStore }},
	{"late_reports", func(s *messages.Stats) any { return &s.LateReports }},
	{"checksum_failures", func(s *messages.Stats) any { return &s.ChecksumFailures }},
	{"actor_restarts", func(s *messages.Stats) any { return &s.ActorRestarts }},
	{"session_open_requests", func(s *messages.Stats) any { return &s.SessionOpen }},
	{"session_calls_in_flight", func(s *messages.Stats) any { return &s.SessionCalls }},
	{"sessions", func(s *messages.Stats) any { return &s.Sessions }},
	{"pool_bytes", func(s *messages.Stats) any { return &s.PoolBytes }},
	{"committed_bytes", func(s *messages.Stats) any { return &s.CommittedBytes }},
	{"used_bytes", func(s *messages.Stats) any { return &s.UsedBytes }},
}

func encodeStats(w *writer, s *messages.Stats) {
	n := len(statFields)
	if s.Engines != nil {
		n++
	}
	if s.Geometries != nil {
		n++
	}
	w.MapLen(n)
	for _, f := range statFields {
		w.Str(f.name)
		switch p := f.ptr(s).(type) {
		case *int:
			w.Int(int64(*p))
		case *int64:
			w.Int(*p)
		case *uint64:
			w.Uint(*p)
		case *bool:
			w.Bool(*p)
		}
	}
	if s.Engines != nil {
		w.Str("engines")
		encodeEngines(w, s.Engines)
	}
	if s.Geometries != nil {
		w.Str("geometries")
		encodeGeometries(w, s.Geometries)
	}
}

// DecodeReply decodes a reply frame to a request of op. Unknown fields are
// skipped (a newer daemon may add some); known fields must have their exact
// types. Errors wrap messages.ErrBadReply.
func DecodeReply(frame []byte, op Op) (*Reply, error) {
	rp, err := decodeReply(frame, op)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", messages.ErrBadReply, op, err)
	}
	return rp, nil
}

// ReplyID reads only the id of a reply frame (to find its caller).
func ReplyID(frame []byte) (uint64, error) {
	r := reader{B: frame}
	n, err := r.MapLen(64)
	if err != nil {
		return 0, err
	}
	for range n {
		k, err := r.Str(64)
		if err != nil {
			return 0, err
		}
		if k == "id" {
			return r.Uint(math.MaxUint64)
		}
		if err := r.Skip(0); err != nil {
			return 0, err
		}
	}
	return 0, fmt.Errorf("reply without an id")
}

func decodeReply(frame []byte, op Op) (*Reply, error) {
	if len(frame) > MaxFrameBytes {
		return nil, fmt.Errorf("frame of %d bytes", len(frame))
	}
	r := &reader{B: frame}
	n, err := r.MapLen(64)
	if err != nil {
		return nil, err
	}
	rp := &Reply{}
	for range n {
		k, err := r.Str(64)
		if err != nil {
			return nil, err
		}
		if err := decodeReplyField(r, rp, op, k); err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
	}
	return rp, nil
}

func decodeReplyField(r *reader, rp *Reply, op Op, k string) error {
	var err error
	u := func(max uint64) int {
		var v uint64
		v, err = r.Uint(max)
		return int(v)
	}
	if op == OpHello && k != "v" && k != "id" && k != "err" {
		return decodeHelloField(r, &rp.Hello, k)
	}
	switch k {
	case "v":
		if v := u(math.MaxUint32); err == nil && v != Version {
			return fmt.Errorf("protocol version %d, want %d", v, Version)
		}
	case "id":
		rp.ID, err = r.Uint(math.MaxUint64)
	case "err":
		rp.Err, err = decodeRemoteError(r)
	case "status":
		var p []byte
		if p, err = r.Bin(MaxKeys); err == nil {
			rp.Status = make([]messages.LookupStatus, len(p))
			for i, c := range p {
				if c > byte(messages.Retry) {
					return fmt.Errorf("lookup status %d", c)
				}
				rp.Status[i] = messages.LookupStatus(c)
			}
		}
	case "job":
		var v uint64
		v, err = r.Uint(math.MaxUint64)
		rp.Job = messages.JobID(v)
	case "slots":
		var n int
		if n, err = r.ArrayLen(MaxKeys, 1); err == nil {
			rp.Slots = make([]int, n)
			for i := range rp.Slots {
				if rp.Slots[i] = u(math.MaxInt32); err != nil {
					return err
				}
			}
		}
	case "workers":
		rp.Workers = u(MaxWorkers)
	case "bound":
		var p []byte
		if p, err = r.Bin(MaxKeys); err == nil {
			rp.Bound = make([]bool, len(p))
			for i, c := range p {
				if c > 1 {
					return fmt.Errorf("bound %d", c)
				}
				rp.Bound[i] = c == 1
			}
		}
	case "to_store":
		rp.ToStore, err = decodeKeys(r, MaxKeys)
	case "evicted":
		rp.Evicted, err = decodeKeys(r, MaxKeys)
	case "events":
		rp.Events, err = decodeEvents(r)
	case "pending":
		rp.Pending, err = r.Bool()
	case "stats":
		err = decodeStats(r, &rp.Stats)
	case "requests":
		rp.Released.Requests = u(math.MaxInt32)
	case "jobs":
		rp.Released.Jobs = u(math.MaxInt32)
	default:
		return r.Skip(0)
	}
	return err
}

func decodeRemoteError(r *reader) (*RemoteError, error) {
	if r.IsNil() {
		return nil, nil
	}
	n, err := r.MapLen(8)
	if err != nil {
		return nil, err
	}
	var code, msg string
	for range n {
		k, err := r.Str(16)
		if err != nil {
			return nil, err
		}
		switch k {
		case "code":
			code, err = r.Str(64)
		case "msg":
			msg, err = r.Str(maxErrorMsgBytes)
		default:
			err = r.Skip(0)
		}
		if err != nil {
			return nil, err
		}
	}
	e, _ := ErrorOf(Code(code), msg).(*RemoteError)
	return e, nil
}

func decodeHelloField(r *reader, h *Hello, k string) error {
	var err error
	u := func(max uint64) uint64 {
		var v uint64
		v, err = r.Uint(max)
		return v
	}
	switch k {
	case "protocol":
		h.Protocol = int(u(math.MaxUint32))
	case "session":
		h.Session = u(math.MaxUint64)
	case "pool_path":
		h.PoolPath, err = r.Str(4096)
	case "block_bytes":
		h.BlockBytes = int(u(math.MaxInt32))
	case "slots":
		h.Slots = int(u(math.MaxInt32))
	case "namespace":
		var ns string
		ns, err = r.Str(MaxNamespaceBytes)
		h.Namespace = messages.Namespace(ns)
	case "heartbeat_ms":
		h.Heartbeat = time.Duration(u(math.MaxUint32)) * time.Millisecond
	case "grace_ms":
		h.Grace = time.Duration(u(math.MaxUint32)) * time.Millisecond
	case "max_keys":
		h.MaxKeys = int(u(math.MaxInt32))
	case "max_frame_bytes":
		h.MaxFrameBytes = int(u(math.MaxInt32))
	case "job_workers":
		h.JobWorkers = int(u(MaxWorkers))
	case "packed_keys":
		h.PackedKeys, err = r.Bool()
	case "index_path":
		h.IndexPath, err = r.Str(4096)
	case "index_complete":
		h.IndexComplete, err = r.Bool()
	case "credit":
		h.Credit, err = r.Bool()
	case "batch":
		h.Batch, err = r.Bool()
	default:
		return r.Skip(0)
	}
	return err
}

func decodeEvents(r *reader) ([]messages.Event, error) {
	n, err := r.ArrayLen(1<<20, 1)
	if err != nil {
		return nil, err
	}
	out := make([]messages.Event, n)
	for i := range out {
		m, err := r.MapLen(16)
		if err != nil {
			return nil, err
		}
		for range m {
			k, err := r.Str(32)
			if err != nil {
				return nil, err
			}
			e := &out[i]
			switch k {
			case "kind":
				var s string
				if s, err = r.Str(32); err == nil {
					e.Kind = eventKind(s)
				}
			case "keys":
				e.Keys, err = decodeKeys(r, MaxKeys)
			case "medium":
				e.Medium, err = r.Str(32)
			case "req":
				if !r.IsNil() {
					e.Ctx, err = decodeReqContext(r)
				}
			case "at_ns":
				var ns int64
				if ns, err = r.Int(math.MinInt64, math.MaxInt64); err == nil {
					e.At = time.Unix(0, ns)
				}
			default:
				err = r.Skip(0)
			}
			if err != nil {
				return nil, fmt.Errorf("event %d: %s: %w", i, k, err)
			}
		}
	}
	return out, nil
}

func eventKind(s string) messages.EventKind {
	for k := messages.BlockStored; k <= messages.AllBlocksCleared; k++ {
		if k.String() == s {
			return k
		}
	}
	return 0
}

func decodeStats(r *reader, s *messages.Stats) error {
	return eachKey(r, 256, "stats.", func(k string) (err error) {
		switch k {
		case "engines":
			s.Engines, err = decodeEngines(r)
			return err
		case "geometries":
			s.Geometries, err = decodeGeometries(r)
			return err
		}
		for _, f := range statFields {
			if f.name != k {
				continue
			}
			switch p := f.ptr(s).(type) {
			case *int:
				var v int64
				v, err = r.Int(math.MinInt32, math.MaxInt32)
				*p = int(v)
			case *int64:
				*p, err = r.Int(0, math.MaxInt64)
			case *uint64:
				*p, err = r.Uint(math.MaxUint64)
			case *bool:
				*p, err = r.Bool()
			}
			return err
		}
		return r.Skip(0)
	})
}

// eachKey reads a map of at most max entries, handing each key to field,
// which reads its value; an error names the key after prefix.
func eachKey(r *reader, max int, prefix string, field func(k string) error) error {
	n, err := r.MapLen(max)
	if err != nil {
		return err
	}
	for range n {
		k, err := r.Str(64)
		if err != nil {
			return err
		}
		if err := field(k); err != nil {
			return fmt.Errorf("%s%s: %w", prefix, k, err)
		}
	}
	return nil
}

// MaxEngines bounds the engine sessions a stats reply lists.
const MaxEngines = 4096

// engineFields is how many fields encodeEngines writes per session.
const engineFields = 11

// encodeEngines writes a stats reply's engine sessions: an array of maps.
func encodeEngines(w *writer, es []messages.EngineSession) {
	w.ArrayLen(len(es))
	for _, e := range es {
		w.MapLen(engineFields)
		kvUint(w, "id", e.ID)
		w.Str("client")
		w.Str(e.Client)
		w.Str("topic")
		w.Str(e.Topic)
		w.Str("namespace")
		w.Str(string(e.Namespace))
		kvUint(w, "block_bytes", uint64(e.BlockBytes))
		w.Str("since_ns")
		w.Int(unixNanoOrZero(e.Since))
		kvUint(w, "calls", e.Calls)
		kvUint(w, "lookups", e.Lookups)
		kvUint(w, "hits", e.Hits)
		kvUint(w, "open", uint64(e.Open))
		kvUint(w, "in_flight", uint64(e.InFlight))
	}
}

// decodeEngines reads what encodeEngines wrote; unknown fields are
// skipped (a newer daemon may add some).
func decodeEngines(r *reader) ([]messages.EngineSession, error) {
	n, err := r.ArrayLen(MaxEngines, 1)
	if err != nil {
		return nil, err
	}
	out := make([]messages.EngineSession, n)
	for i := range out {
		if err := decodeEngine(r, &out[i]); err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
	}
	return out, nil
}

func decodeEngine(r *reader, e *messages.EngineSession) error {
	return eachKey(r, 64, "", func(k string) (err error) {
		var u uint64
		var ns string
		switch k {
		case "id":
			e.ID, err = r.Uint(math.MaxUint64)
		case "client":
			e.Client, err = r.Str(MaxNameBytes)
		case "topic":
			e.Topic, err = r.Str(MaxNameBytes)
		case "namespace":
			ns, err = r.Str(MaxNamespaceBytes)
			e.Namespace = messages.Namespace(ns)
		case "block_bytes":
			u, err = r.Uint(MaxBlockBytes)
			e.BlockBytes = int(u)
		case "since_ns":
			var t int64
			t, err = r.Int(math.MinInt64, math.MaxInt64)
			if t != 0 {
				e.Since = time.Unix(0, t)
			}
		case "calls":
			e.Calls, err = r.Uint(math.MaxUint64)
		case "lookups":
			e.Lookups, err = r.Uint(math.MaxUint64)
		case "hits":
			e.Hits, err = r.Uint(math.MaxUint64)
		case "open":
			u, err = r.Uint(math.MaxInt32)
			e.Open = int(u)
		case "in_flight":
			u, err = r.Uint(math.MaxInt32)
			e.InFlight = int(u)
		default:
			err = r.Skip(0)
		}
		return err
	})
}

// unixNanoOrZero is t in Unix nanoseconds, 0 for the zero time (whose
// UnixNano is undefined).
func unixNanoOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// geometryFields are the fields of a stats reply's geometry, in order.
var geometryFields = []struct {
	name string
	ptr  func(*messages.GeometryStats) *int
}{
	{"block_bytes", func(g *messages.GeometryStats) *int { return &g.BlockBytes }},
	{"slots", func(g *messages.GeometryStats) *int { return &g.Slots }},
	{"committed", func(g *messages.GeometryStats) *int { return &g.Committed }},
	{"free", func(g *messages.GeometryStats) *int { return &g.Free }},
	{"ready", func(g *messages.GeometryStats) *int { return &g.Ready }},
}

// MaxGeometries bounds the geometries a stats reply lists.
const MaxGeometries = 64

// encodeGeometries writes the pool's geometries: an array of maps.
func encodeGeometries(w *writer, gs []messages.GeometryStats) {
	w.ArrayLen(len(gs))
	for i := range gs {
		w.MapLen(len(geometryFields))
		for _, f := range geometryFields {
			kvUint(w, f.name, uint64(*f.ptr(&gs[i])))
		}
	}
}

// decodeGeometries reads what encodeGeometries wrote; unknown fields are
// skipped.
func decodeGeometries(r *reader) ([]messages.GeometryStats, error) {
	n, err := r.ArrayLen(MaxGeometries, 1)
	if err != nil {
		return nil, err
	}
	out := make([]messages.GeometryStats, n)
	for i := range out {
		err := eachKey(r, 64, "", func(k string) error {
			for _, f := range geometryFields {
				if f.name == k {
					u, err := r.Uint(math.MaxInt32)
					*f.ptr(&out[i]) = int(u)
					return err
				}
			}
			return r.Skip(0)
		})
		if err != nil {
			return nil, fmt.Errorf("geometries[%d]: %w", i, err)
		}
	}
	return out, nil
}
