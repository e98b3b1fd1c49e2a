package events

import (
	"slices"

	"github.com/kvtier/kvtier/messages"
)

// engineTopics is which topics each key namespace's blocks are announced
// under: the topics of the engines of that namespace (their hellos said
// them; the endpoint tells the hub, *messages.EngineTopic). Hub state.
type engineTopics struct {
	bySession map[uint64]engineTopic
	byNS      map[messages.Namespace]map[string]int // topic → engines of the namespace with it
	fromLearn map[engineTopic]bool                  // learned from the engines' own streams
}

type engineTopic struct {
	ns    messages.Namespace
	topic string
}

// apply records what m says of its session: its namespace and topic, or
// that it is gone. It reports whether the namespace has a topic it had not
// (an engine under a topic new to the namespace: its blocks so far are to
// be announced there).
func (t *engineTopics) apply(m *messages.EngineTopic) bool {
	if old, ok := t.bySession[m.Session]; ok {
		delete(t.bySession, m.Session)
		if n := t.byNS[old.ns][old.topic] - 1; n > 0 {
			t.byNS[old.ns][old.topic] = n
		} else {
			delete(t.byNS[old.ns], old.topic)
			if len(t.byNS[old.ns]) == 0 {
				delete(t.byNS, old.ns)
			}
		}
	}
	if m.Gone || m.Topic == "" || m.Namespace == "" {
		return false
	}
	if t.bySession == nil {
		t.bySession = map[uint64]engineTopic{}
	}
	et := engineTopic{ns: m.Namespace, topic: m.Topic}
	t.bySession[m.Session] = et
	return t.add(et)
}

// add counts one more engine of et's namespace under et's topic; true
// when it is the first.
func (t *engineTopics) add(et engineTopic) bool {
	if t.byNS == nil {
		t.byNS = map[messages.Namespace]map[string]int{}
	}
	if t.byNS[et.ns] == nil {
		t.byNS[et.ns] = map[string]int{}
	}
	t.byNS[et.ns][et.topic]++
	return t.byNS[et.ns][et.topic] == 1
}

// has reports whether some engine of ns goes by topic.
func (t *engineTopics) has(ns messages.Namespace, topic string) bool {
	return t.byNS[ns][topic] > 0
}

// learned records that the engine publishing its own events under topic
// stored blocks of namespace ns (kept for the hub's life: its stream
// names no session). It reports whether the namespace has a topic it had
// not.
func (t *engineTopics) learned(ns messages.Namespace, topic string) bool {
	et := engineTopic{ns: ns, topic: topic}
	if ns == "" || t.fromLearn[et] {
		return false
	}
	if t.fromLearn == nil {
		t.fromLearn = map[engineTopic]bool{}
	}
	t.fromLearn[et] = true
	return t.add(et)
}

// topicsOf is where events of namespace ns go, sorted: its engines'
// topics, or the publisher's own ("") when it has none; every topic and
// the publisher's own for a clear (ns "").
func (t *engineTopics) topicsOf(ns messages.Namespace) []string {
	var out []string
	if ns == "" {
		out = append(out, "")
		for _, topics := range t.byNS {
			for topic := range topics {
				out = append(out, topic)
			}
		}
	} else {
		for topic := range t.byNS[ns] {
			out = append(out, topic)
		}
		if len(out) == 0 {
			out = append(out, "")
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// topicGroup is one topic's events of a batch, in the order they came,
// and their places in the batch (groups with equal places have equal
// payloads: encoded once).
type topicGroup struct {
	topic   string
	events  []Event
	places  []int
	payload []byte // its encoding, once made
}

// route groups a batch's events (spaces[i] is events[i]'s namespace) by
// the topics they go to, topics in the order first needed.
func (t *engineTopics) route(events []Event, spaces []messages.Namespace) []topicGroup {
	var groups []topicGroup
	at := map[string]int{}
	known := map[messages.Namespace][]string{}
	for i, ev := range events {
		topics, ok := known[spaces[i]]
		if !ok {
			topics = t.topicsOf(spaces[i])
			known[spaces[i]] = topics
		}
		for _, topic := range topics {
			j, ok := at[topic]
			if !ok {
				j = len(groups)
				at[topic] = j
				groups = append(groups, topicGroup{topic: topic})
			}
			groups[j].events = append(groups[j].events, ev)
			groups[j].places = append(groups[j].places, i)
		}
	}
	return groups
}

// namespaceOf is the namespace of e's first key ("" for a clear).
func namespaceOf(e *messages.Event) messages.Namespace {
	if len(e.Keys) == 0 {
		return ""
	}
	return e.Keys[0].Namespace
}

// splitByNamespace is e as one event per key namespace, in the order each
// namespace first appears, with each key's placement and provenance kept
// beside it (e itself when its keys share one).
func splitByNamespace(e *messages.Event) []*messages.Event {
	ns := namespaceOf(e)
	mixed := false
	for _, k := range e.Keys {
		if k.Namespace != ns {
			mixed = true
			break
		}
	}
	if !mixed {
		return []*messages.Event{e}
	}
	var parts []*messages.Event
	at := map[messages.Namespace]int{}
	for i, k := range e.Keys {
		j, ok := at[k.Namespace]
		if !ok {
			j = len(parts)
			at[k.Namespace] = j
			part := *e
			part.Keys, part.Place, part.Prov = nil, nil, nil
			parts = append(parts, &part)
		}
		p := parts[j]
		p.Keys = append(p.Keys, k)
		if len(e.Place) == len(e.Keys) {
			p.Place = append(p.Place, e.Place[i])
		}
		if len(e.Prov) == len(e.Keys) {
			p.Prov = append(p.Prov, e.Prov[i])
		}
	}
	return parts
}
