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
//   - open holds the keys the job still owns at the CPU tier (pinned for a
//     load, write-pending for a store); each key is released exactly once.
type job struct {
	id       messages.JobID
	kind     messages.JobKind
	req      *messages.ReqContext
	keys     []messages.Key            // every key of the job, in call (chain) order
	slots    map[messages.Key]int      // key → slot, every key of the job
	place    placeMap                  // store jobs: each key's place in its PrepareStore call; nil for loads
	open     map[messages.Key]struct{} // keys still owned at the CPU tier
	reported []bool
	nReports int
	allOK    bool
	timer    supervision.Timer
}

func (j *job) ref() messages.JobRef {
	return messages.JobRef{Origin: messages.OriginEngine, ID: j.id}
}

func (j *job) openKeys() []messages.Key {
	out := make([]messages.Key, 0, len(j.open))
	for _, k := range j.keys {
		if _, ok := j.open[k]; ok {
			out = append(out, k)
		}
	}
	return out
}

// placeMap locates each key of a store job in the call that opened it (its
// PrepareStore), for the stored event's token ids and parent.
type placeMap = map[messages.Key]messages.Placement

// placed returns keys in chain order (by their index in the job's call)
// with the placement of each; keys come from the job, so every one is placed.
func (j *job) placed(keys []messages.Key) ([]messages.Key, []messages.Placement) {
	if j.place == nil {
		return keys, nil
	}
	sorted := slices.Clone(keys)
	slices.SortStableFunc(sorted, func(a, b messages.Key) int { return j.place[a].Index - j.place[b].Index })
	place := make([]messages.Placement, len(sorted))
	for i, k := range sorted {
		place[i] = j.place[k]
	}
	return sorted, place
}

// registry holds the in-flight engine jobs and, per request, the jobs it
// opened. It is plain data owned by the bridge actor.
type registry struct {
	jobs  map[messages.JobID]*job
	byReq map[string]map[messages.JobID]*job
}

func newRegistry() registry {
	return registry{jobs: map[messages.JobID]*job{}, byReq: map[string]map[messages.JobID]*job{}}
}

func (r *registry) add(j *job) {
	r.jobs[j.id] = j
	id := j.req.RequestID
	if r.byReq[id] == nil {
		r.byReq[id] = map[messages.JobID]*job{}
	}
	r.byReq[id][j.id] = j
}

func (r *registry) remove(j *job) {
	delete(r.jobs, j.id)
	if m := r.byReq[j.req.RequestID]; m != nil {
		delete(m, j.id)
		if len(m) == 0 {
			delete(r.byReq, j.req.RequestID)
		}
	}
	if j.timer != nil {
		j.timer.Stop()
	}
}

// claim finds, for each key, an open job of kind for request req that owns
// it, and takes the key out of that job. All-or-nothing: if a key has no
// owner, nothing is claimed and ok is false with the first such key.
func (r *registry) claim(req string, kind messages.JobKind, keys []messages.Key) (byJob map[*job][]messages.Key, missing messages.Key, ok bool) {
	if j := r.wholeJob(req, kind, keys); j != nil {
		clear(j.open)
		return map[*job][]messages.Key{j: keys}, messages.Key{}, true
	}
	byJob = map[*job][]messages.Key{}
	taken := map[messages.Key]bool{}
	for _, k := range keys {
		owner := r.ownerOf(req, kind, k, taken)
		if owner == nil {
			return nil, k, false
		}
		taken[k] = true
		byJob[owner] = append(byJob[owner], k)
	}
	for j, ks := range byJob {
		for _, k := range ks {
			delete(j.open, k)
		}
	}
	return byJob, messages.Key{}, true
}

// wholeJob finds the job of kind for req whose keys are keys, in order,
// all still open: the usual completion (a connector completes each job's
// keys in one call), claimed without a map access per key.
func (r *registry) wholeJob(req string, kind messages.JobKind, keys []messages.Key) *job {
	for _, j := range r.byReq[req] {
		if j.kind == kind && len(j.open) == len(j.keys) && slices.Equal(j.keys, keys) {
			return j
		}
	}
	return nil
}

func (r *registry) ownerOf(req string, kind messages.JobKind, k messages.Key, taken map[messages.Key]bool) *job {
	if taken[k] {
		return nil
	}
	for _, j := range r.byReq[req] {
		if _, has := j.open[k]; has && j.kind == kind {
			return j
		}
	}
	return nil
}
