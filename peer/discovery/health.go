package discovery

import (
	"sync"

	"github.com/rs/zerolog"
)

// part is one half of being up: registered (our lease is kept alive) and
// watching (the view follows etcd).
type part uint8

const (
	registration part = iota
	membership
)

func (p part) String() string {
	if p == registration {
		return "registration"
	}
	return "watch"
}

// health is whether etcd answers, as the two goroutines see it, and the
// logging of its changes: one warn line when it goes down (with the first
// error), one info line when it is back; failures in between go to debug,
// so an etcd outage of an hour is two lines, not one per retry.
type health struct {
	log   zerolog.Logger
	mu    sync.Mutex
	parts [2]bool
	isUp  bool
	quiet bool // a down line was logged since the last up
	bad   bool // the latest report was a failure
}

func (h *health) up() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.isUp
}

// failing reports whether the latest report was a failure: etcd is known
// not to answer (just registered, not yet up, is not failing).
func (h *health) failing() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.bad
}

// ok marks p healthy.
func (h *health) ok(p part) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.parts[p], h.bad = true, false
	if h.parts[registration] && h.parts[membership] && !h.isUp {
		h.isUp, h.quiet = true, false
		h.log.Info().Msg("peer discovery: etcd up: registered and watching members")
	}
}

// failed marks p unhealthy because of err.
func (h *health) failed(p part, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.parts[p], h.isUp, h.bad = false, false, true
	ev := h.log.Debug()
	if !h.quiet {
		ev, h.quiet = h.log.Warn(), true
	}
	ev.Err(err).Str("part", p.String()).
		Msg("peer discovery: etcd unavailable; retrying with backoff (peer sessions are kept)")
}
