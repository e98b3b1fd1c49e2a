package sim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvtier/kvtier/messages"
)

// deliver runs every job due by now: its workers copy and report.
func (e *engine) deliver(ctx context.Context) error {
	for j := e.jobs.popDue(e.now); j != nil; j = e.jobs.popDue(e.now) {
		if err := e.work(ctx, j); err != nil {
			return err
		}
	}
	return nil
}

// work plays a job's workers one after another: each copies its shard of
// every block (a load verifies the slot's bytes, a store writes them) and
// reports with JobDone. A load's request then computes this step.
func (e *engine) work(ctx context.Context, j *job) error {
	workers := max(j.workers, 1)
	bad := make([]bool, len(j.keys))
	for w := range workers {
		for i, k := range j.keys {
			slot := e.pool.Slot(j.slots[i])
			if j.kind == messages.JobStore {
				WriteShard(slot, k, workers, w)
			} else if !VerifyShard(slot, k, workers, w) {
				bad[i] = true
			}
		}
		if err := e.report(ctx, j, w); err != nil {
			return err
		}
	}
	e.account(j, bad)
	if j.kind == messages.JobStore {
		e.storing -= len(j.keys)
		return e.settle(ctx)
	}
	return nil
}

// settle waits, with Settle set, until the node has committed every store
// whose reports were sent: commits land asynchronously after the last
// JobDone (checksummed off the mailbox), and the CPU tier's recency order is
// their landing order, so without this wait two runs of one seed can evict
// differently. It polls Stats until WritePending is down to the keys of the
// store jobs still copying; past DrainTimeout it counts a timeout and goes
// on. It polls with a short sleep backoff because the node offers no
// commit notification (spinning on Stats starves the commit on 2 cores).
// (A node with other writers — promotions, peers — would need an
// explicit commit acknowledgement instead.)
func (e *engine) settle(ctx context.Context) error {
	if !e.cfg.Settle {
		return nil
	}
	var deadline time.Time
	for backoff := 5 * time.Microsecond; ; backoff = min(2*backoff, time.Millisecond) {
		st, err := e.mgr.Stats(ctx)
		if err != nil {
			return fmt.Errorf("stats: %w", err)
		}
		if st.WritePending <= e.storing {
			return nil
		}
		e.sum.SettlePolls++
		if deadline.IsZero() {
			deadline = time.Now().Add(e.cfg.DrainTimeout)
		} else if time.Now().After(deadline) {
			e.sum.SettleTimeouts++
			return nil
		}
		time.Sleep(backoff)
	}
}

// report sends worker w's JobDone. A report for a job the node no longer
// knows (reaped) is counted, not fatal.
func (e *engine) report(ctx context.Context, j *job, w int) error {
	if j.workers <= 0 {
		return nil
	}
	err := e.mgr.JobDone(ctx, j.id, w, true)
	if errors.Is(err, messages.ErrUnknownJob) {
		e.sum.LateReports++
		return nil
	}
	if err != nil {
		return fmt.Errorf("job done %d (%s) worker %d: %w", j.id, j.kind, w, err)
	}
	return nil
}

// account counts a finished job's blocks and wakes its request.
func (e *engine) account(j *job, bad []bool) {
	if j.kind == messages.JobStore {
		e.sum.BlocksStored += len(j.keys)
		return
	}
	for _, b := range bad {
		if b {
			e.sum.CorruptBlocks++
		} else {
			e.sum.BlocksVerified++
		}
	}
	if j.owner != nil {
		j.owner.phase = PhaseCompute
	}
}

// quiesce waits, after the last report, until the node has no pending work,
// pins, leases or pending writes (commits are asynchronous), or until
// DrainTimeout; what is left is reported as leaked. The node offers no
// notification for this, so it polls with a short backoff.
func (e *engine) quiesce(ctx context.Context) error {
	deadline := time.Now().Add(e.cfg.DrainTimeout)
	for backoff := 50 * time.Microsecond; ; backoff = min(2*backoff, 10*time.Millisecond) {
		pending, err := e.mgr.HasPendingWork(ctx)
		if err != nil {
			return fmt.Errorf("has pending work: %w", err)
		}
		st, err := e.mgr.Stats(ctx)
		if err != nil {
			return fmt.Errorf("stats: %w", err)
		}
		e.sum.PendingWorkAtEnd = pending
		e.sum.Evictions, e.sum.NodeRequests = st.Evictions, st.Requests
		e.sum.LeakedPins, e.sum.LeakedLeases, e.sum.LeakedWritePending = st.Pinned, st.Leased, st.WritePending
		quiet := !pending && st.Pinned == 0 && st.Leased == 0 && st.WritePending == 0
		if quiet || time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
	}
}
