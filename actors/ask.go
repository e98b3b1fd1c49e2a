package actors

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// channelProcess is a process that forwards what it is sent into a channel.
// It stands in for protoactor's Future: its sends never block and a late
// message after the caller gave up is simply dropped, so there is no race
// between a timeout and a reply (upstream #1139, #1145).
type channelProcess struct {
	user chan any
	sys  chan any
}

func (p *channelProcess) SendUserMessage(_ *actor.PID, message any) {
	_, msg, _ := actor.UnwrapEnvelope(message)
	select {
	case p.user <- msg:
	default:
	}
}

func (p *channelProcess) SendSystemMessage(_ *actor.PID, message any) {
	select {
	case p.sys <- message:
	default:
	}
}

func (p *channelProcess) Stop(*actor.PID) {}

var processSeq atomic.Uint64

func register(system *actor.ActorSystem) (*actor.PID, *channelProcess, func()) {
	p := &channelProcess{user: make(chan any, 1), sys: make(chan any, 1)}
	id := fmt.Sprintf("$ask-%d", processSeq.Add(1))
	pid, _ := system.ProcessRegistry.Add(p, id)
	return pid, p, func() { system.ProcessRegistry.Remove(pid) }
}

// Ask sends msg to target with a temporary sender and waits for the first
// message that sender receives, or ctx's end: a test standing in for an
// actor that asks with a correlation id (messages' request/reply rule; the
// node and the endpoint ask with a Reply instead).
func Ask(ctx context.Context, system *actor.ActorSystem, target *actor.PID, msg any) (any, error) {
	pid, p, done := register(system)
	defer done()
	system.Root.RequestWithCustomSender(target, msg, pid)
	select {
	case r := <-p.user:
		return r, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("ask %s: %w", target.Id, ctx.Err())
	}
}

// StopAndWait stops pid (after the message it is processing) and waits until
// it and its children have terminated, or ctx ends.
func StopAndWait(ctx context.Context, system *actor.ActorSystem, pid *actor.PID) error {
	watcher, p, done := register(system)
	defer done()
	proc, ok := system.ProcessRegistry.Get(pid)
	if !ok {
		return nil // already gone
	}
	proc.SendSystemMessage(pid, &actor.Watch{Watcher: watcher})
	system.Root.Stop(pid)
	for {
		select {
		case m := <-p.sys:
			if t, ok := m.(*actor.Terminated); ok && t.Who.Equal(pid) {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("stop %s: %w", pid.Id, ctx.Err())
		}
	}
}
