package cpu

import "github.com/kvtier/kvtier/messages"

// eventLog buffers the tier's events until an engine takes them, up to max:
// past that each new event overwrites the oldest, counted as dropped. Once
// full it is a ring, so an engine that never drains costs a store per
// event, not a slide of the whole buffer and its regrowth.
type eventLog struct {
	buf     []messages.Event // Invariant: len(buf) <= max; a ring once len(buf) == max
	head    int              // the oldest event's index once full, else 0
	max     int
	dropped uint64
}

func (l *eventLog) add(e messages.Event) {
	if len(l.buf) < l.max {
		l.buf = append(l.buf, e)
		return
	}
	l.buf[l.head] = e
	l.head = (l.head + 1) % l.max
	l.dropped++
}

// take returns the events buffered, oldest first, and how many were dropped
// since the last take, and empties the log.
func (l *eventLog) take() ([]messages.Event, uint64) {
	events, dropped := l.buf, l.dropped
	if l.head > 0 {
		events = append(append(make([]messages.Event, 0, len(l.buf)), l.buf[l.head:]...), l.buf[:l.head]...)
	}
	*l = eventLog{max: l.max}
	return events, dropped
}
