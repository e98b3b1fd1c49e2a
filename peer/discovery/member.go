package discovery

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
)

// Member is what a node registers under <prefix>nodes/<node_id>, as JSON.
type Member struct {
	Node       string   `json:"node_id"`
	Control    string   `json:"control"`              // control-plane ROUTER address, tcp://host:port
	Data       string   `json:"data,omitempty"`       // data-plane address, when the node knows it (informational)
	Transport  string   `json:"transport"`            // data plane: tcp or nixl
	Namespaces []string `json:"namespaces,omitempty"` // served namespaces; empty: any
	BlockBytes int      `json:"block_bytes"`
	Slots      int      `json:"slots"`
	Protocol   int      `json:"protocol"` // peer wire protocol version
	// Events and EventsReplay are where the node publishes its KV events
	// (for its peers' directories), Metrics its /metrics URL (for `kvtier
	// fleet status`); empty when it has none.
	Events       string    `json:"events,omitempty"`
	EventsReplay string    `json:"events_replay,omitempty"`
	Metrics      string    `json:"metrics,omitempty"`
	Started      time.Time `json:"started"`
	// Instance is drawn once per process: it tells this process's own key,
	// surviving an etcd outage under an old lease, from another live node
	// claiming the same id.
	Instance string `json:"instance"`
}

// Kind is what happened to a member, as logs name it.
type Kind string

const (
	// Joined: a member appeared, or its record changed (it restarted,
	// perhaps elsewhere); Event.Member is its record now.
	Joined Kind = "joined"
	// Left: a member's key went away while etcd answered (a graceful
	// close, an expired lease); Event.Member is its last record.
	Left Kind = "left"
)

// Event is one change of membership.
type Event struct {
	Kind   Kind
	Member Member
}

// errBadRecord marks a key under the prefix that is not a member record.
var errBadRecord = errors.New("discovery: bad member record")

// nodesDir is where members live under the prefix.
const nodesDir = "nodes/"

func nodeKey(prefix, node string) string { return prefix + nodesDir + node }

// nodeOf is the node id a key names, or false for a key that is not a
// member's.
func nodeOf(prefix, key string) (string, bool) {
	id, ok := strings.CutPrefix(key, prefix+nodesDir)
	return id, ok && id != ""
}

// decode parses a member's record and checks it names the node its key
// does.
func decode(node string, value []byte) (Member, error) {
	var m Member
	if err := json.Unmarshal(value, &m); err != nil {
		return Member{}, fmt.Errorf("%w: %q: %w", errBadRecord, node, err)
	}
	switch {
	case m.Node != node:
		return Member{}, fmt.Errorf("%w: key %q holds node %q", errBadRecord, node, m.Node)
	case m.Control == "":
		return Member{}, fmt.Errorf("%w: %q: no control address", errBadRecord, node)
	}
	return m, nil
}

// same reports whether two records of a node are equal.
func same(a, b Member) bool {
	return a.Node == b.Node && a.Control == b.Control && a.Data == b.Data && a.Transport == b.Transport &&
		slices.Equal(a.Namespaces, b.Namespaces) && a.BlockBytes == b.BlockBytes && a.Slots == b.Slots &&
		a.Protocol == b.Protocol && a.Started.Equal(b.Started) && a.Instance == b.Instance &&
		a.Events == b.Events && a.EventsReplay == b.EventsReplay && a.Metrics == b.Metrics
}

// view is the members this node knows, without itself: the pure core the
// watcher feeds, returning the events each change makes.
//
// Invariant: it changes only on what etcd answered (a listing, a watch
// event); an unreachable etcd leaves it as it was.
type view struct {
	self    string
	members map[string]Member
}

func newView(self string) view { return view{self: self, members: map[string]Member{}} }

// put records m; an event unless m is this node or unchanged.
func (v *view) put(m Member) []Event {
	if m.Node == v.self {
		return nil
	}
	if old, ok := v.members[m.Node]; ok && same(old, m) {
		return nil
	}
	v.members[m.Node] = m
	return []Event{{Kind: Joined, Member: m}}
}

// del forgets node; an event if it was known.
func (v *view) del(node string) []Event {
	old, ok := v.members[node]
	if !ok {
		return nil
	}
	delete(v.members, node)
	return []Event{{Kind: Left, Member: old}}
}

// reset replaces the view with a full listing: Left for every member the
// listing lacks, Joined for every new or changed one, in node order.
func (v *view) reset(list []Member) []Event {
	listed := map[string]bool{}
	var evs []Event
	for _, m := range list {
		if m.Node != v.self {
			listed[m.Node] = true
		}
	}
	for _, node := range v.nodes() {
		if !listed[node] {
			evs = append(evs, v.del(node)...)
		}
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Node < list[j].Node })
	for _, m := range list {
		evs = append(evs, v.put(m)...)
	}
	return evs
}

// nodes is the known members' ids, sorted.
func (v *view) nodes() []string {
	return slices.Sorted(maps.Keys(v.members))
}
