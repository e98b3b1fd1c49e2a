package scheduler

import (
	"slices"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
)

// job is one engine transfer job.
//
// Invariants:
//   - a job is in the registry until all its workers reported, all its keys
//     were completed by CompleteLoad/CompleteStore, or its deadline reaped it;
//     then it is gone, and any later report is late.
//   - open marks the keys the job still owns at the CPU tier (pinned for a
//     load, write-pending for a store); each key is released exactly once.
//     Every place of a key named twice is open or closed together.
//
// A job's keys are in slices indexed by their place in keys, not in maps:
// most jobs hold a handful of keys, and two maps a job were a tenth of the
// daemon's CPU per call. A job of more than smallJob keys finds a key's
// place through index, made when the job is.
type job struct {
	id       messages.JobID
	kind     messages.JobKind
	req      *messages.ReqContext
	keys     []messages.Key       // every key of the job, in call (chain) order
	slots    []int                // slots[i] is keys[i]'s slot
	place    []messages.Placement // store jobs: keys[i]'s place in its PrepareStore call; nil for loads
	open     []bool               // open[i]: keys[i] is still owned at the CPU tier
	nOpen    int                  // how many of open are true
	index    map[messages.Key]int // key → its first place in keys; nil for a job of at most smallJob keys
	dups     bool                 // a key stands twice in keys
	reported []bool
	nReports int
	allOK    bool
	timer    supervision.Timer
}

// smallJob is the most keys a job finds by a scan of its keys rather than
// through an index.
const smallJob = 16

// indexKeys sets the job's index (for a large job) and dups.
func (j *job) indexKeys() {
	if len(j.keys) <= smallJob {
		for i, k := range j.keys {
			if slices.Contains(j.keys[:i], k) {
				j.dups = true
				return
			}
		}
		return
	}
	j.index = make(map[messages.Key]int, len(j.keys))
	for i, k := range j.keys {
		if _, seen := j.index[k]; seen {
			j.dups = true
			continue
		}
		j.index[k] = i
	}
}

// at is k's first place in the job's keys.
func (j *job) at(k messages.Key) (int, bool) {
	if j.index != nil {
		i, ok := j.index[k]
		return i, ok
	}
	i := slices.Index(j.keys, k)
	return i, i >= 0
}

// owns reports whether k is one of the job's open keys, and its place.
func (j *job) owns(k messages.Key) (int, bool) {
	i, ok := j.at(k)
	return i, ok && j.open[i]
}

// close takes the key at place i (and its other places) out of the job.
func (j *job) close(i int) {
	if !j.dups {
		j.open[i] = false
		j.nOpen--
		return
	}
	for p, k := range j.keys {
		if j.open[p] && k == j.keys[i] {
			j.open[p] = false
			j.nOpen--
		}
	}
}

// closeAll takes every key out of the job.
func (j *job) closeAll() {
	clear(j.open)
	j.nOpen = 0
}

func (j *job) ref() messages.JobRef {
	return messages.JobRef{Origin: messages.OriginEngine, ID: j.id}
}

// openPlaces returns the places of the job's open keys, in keys order.
func (j *job) openPlaces() []int {
	out := make([]int, 0, j.nOpen)
	for i, open := range j.open {
		if open {
			out = append(out, i)
		}
	}
	return out
}

// keysAt returns the job's keys at places at.
func (j *job) keysAt(at []int) []messages.Key {
	out := make([]messages.Key, len(at))
	for i, p := range at {
		out[i] = j.keys[p]
	}
	return out
}

// placed returns the keys at places at in chain order (by their index in
// the job's call), with their slots and, for a store, their placements.
func (j *job) placed(at []int) ([]messages.Key, []int, []messages.Placement) {
	if j.place != nil {
		at = slices.Clone(at)
		slices.SortStableFunc(at, func(a, b int) int { return j.place[a].Index - j.place[b].Index })
	}
	keys, slots := j.keysAt(at), make([]int, len(at))
	var place []messages.Placement
	if j.place != nil {
		place = make([]messages.Placement, len(at))
	}
	for i, p := range at {
		slots[i] = j.slots[p]
		if place != nil {
			place[i] = j.place[p]
		}
	}
	return keys, slots, place
}

// registry holds the in-flight engine jobs and, per request, the jobs it
// opened (in the order they opened). It is plain data owned by the bridge
// actor.
type registry struct {
	jobs  map[messages.JobID]*job
	byReq map[string][]*job
}

func newRegistry() registry {
	return registry{jobs: map[messages.JobID]*job{}, byReq: map[string][]*job{}}
}

func (r *registry) add(j *job) {
	r.jobs[j.id] = j
	r.byReq[j.req.RequestID] = append(r.byReq[j.req.RequestID], j)
}

func (r *registry) remove(j *job) {
	delete(r.jobs, j.id)
	id := j.req.RequestID
	if jobs := slices.DeleteFunc(r.byReq[id], func(o *job) bool { return o == j }); len(jobs) > 0 {
		r.byReq[id] = jobs
	} else {
		delete(r.byReq, id)
	}
	if j.timer != nil {
		j.timer.Stop()
	}
}

// claimed is what a completion took from one job: the places of its keys
// in the job's keys, one per key the completion named.
type claimed struct {
	j  *job
	at []int
}

// keys returns the claimed keys, as the completion named them.
func (c claimed) keys() []messages.Key { return c.j.keysAt(c.at) }

// claim finds, for each key, an open job of kind for request req that owns
// it, and takes the key out of that job. All-or-nothing: if a key has no
// owner, nothing is claimed and ok is false with the first such key.
func (r *registry) claim(req string, kind messages.JobKind, keys []messages.Key) (byJob []claimed, missing messages.Key, ok bool) {
	if j := r.wholeJob(req, kind, keys); j != nil {
		j.closeAll()
		at := make([]int, len(keys))
		for i := range at {
			at[i] = i
		}
		return []claimed{{j, at}}, messages.Key{}, true
	}
	taken := map[messages.Key]bool{}
	for _, k := range keys {
		owner, i := r.ownerOf(req, kind, k, taken)
		if owner == nil {
			return nil, k, false
		}
		taken[k] = true
		if c := slices.IndexFunc(byJob, func(c claimed) bool { return c.j == owner }); c >= 0 {
			byJob[c].at = append(byJob[c].at, i)
		} else {
			byJob = append(byJob, claimed{owner, []int{i}})
		}
	}
	for _, c := range byJob {
		for _, i := range c.at {
			c.j.close(i)
		}
	}
	return byJob, messages.Key{}, true
}

// wholeJob finds the job of kind for req whose keys are keys, in order,
// all still open and each once: the usual completion (a connector
// completes each job's keys in one call), claimed without a lookup per key.
func (r *registry) wholeJob(req string, kind messages.JobKind, keys []messages.Key) *job {
	for _, j := range r.byReq[req] {
		if j.kind == kind && !j.dups && j.nOpen == len(j.keys) && slices.Equal(j.keys, keys) {
			return j
		}
	}
	return nil
}

func (r *registry) ownerOf(req string, kind messages.JobKind, k messages.Key, taken map[messages.Key]bool) (*job, int) {
	if taken[k] {
		return nil, -1
	}
	for _, j := range r.byReq[req] {
		if i, has := j.owns(k); has && j.kind == kind {
			return j, i
		}
	}
	return nil, -1
}
