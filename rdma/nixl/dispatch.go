//go:build nixl && cgo

package nixl

import "sync"

// dispatcher runs done callbacks on its own goroutine, in order, so that a
// callback never runs on the NIXL thread and may call back into the
// transport. Its queue is unbounded: the actor never waits on a callback.
type dispatcher struct {
	mu      sync.Mutex
	q       []completion
	stopped bool
	wake    chan struct{} // capacity 1
	exited  chan struct{}
}

func newDispatcher() *dispatcher {
	d := &dispatcher{wake: make(chan struct{}, 1), exited: make(chan struct{})}
	go d.run()
	return d
}

func (d *dispatcher) push(cs ...completion) {
	d.mu.Lock()
	d.q = append(d.q, cs...)
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// stop delivers what is queued, then ends the goroutine and waits for it.
func (d *dispatcher) stop() {
	d.mu.Lock()
	d.stopped = true
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
	<-d.exited
}

func (d *dispatcher) run() {
	defer close(d.exited)
	for range d.wake {
		for {
			d.mu.Lock()
			q, stopped := d.q, d.stopped
			d.q = nil
			d.mu.Unlock()
			for _, c := range q {
				c.done(c.c)
			}
			if len(q) == 0 {
				if stopped {
					return
				}
				break
			}
		}
	}
}
