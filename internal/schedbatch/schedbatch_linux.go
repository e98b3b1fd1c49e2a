package schedbatch

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// maxSweeps bounds the passes over the process's threads: a thread cloned
// during a pass from one not yet moved keeps the old policy, so Apply
// passes again until one finds every thread moved.
const maxSweeps = 8

// Apply moves every thread of this process to SCHED_BATCH unless the
// environment says KVTIERD_SCHED=normal; threads started afterwards
// inherit it. It returns the policy in force ("batch" or "normal").
func Apply() (string, error) {
	switch v := os.Getenv(Env); v {
	case "normal":
		return "normal", nil
	case "", "batch":
	default:
		return "normal", fmt.Errorf("%s=%q: want batch or normal", Env, v)
	}
	for range maxSweeps {
		moved, err := sweep()
		if err != nil {
			return "normal", err
		}
		if moved == 0 {
			return "batch", nil
		}
	}
	return "batch", nil // NB: threads were still being started; the later ones inherit it
}

// sweep moves each thread of the process not yet under SCHED_BATCH and
// returns how many it moved.
func sweep() (int, error) {
	tids, err := Threads()
	if err != nil {
		return 0, err
	}
	moved := 0
	for _, tid := range tids {
		attr, err := unix.SchedGetAttr(tid, 0)
		if err != nil {
			continue // NB: the thread exited
		}
		if attr.Policy == unix.SCHED_BATCH {
			continue
		}
		err = unix.SchedSetAttr(tid, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_BATCH, Nice: attr.Nice}, 0)
		if err != nil && err != unix.ESRCH {
			return moved, fmt.Errorf("sched_setattr(%d, SCHED_BATCH): %w", tid, err)
		}
		moved++
	}
	return moved, nil
}

// Threads lists the ids of this process's threads.
func Threads() ([]int, error) {
	entries, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, err
	}
	tids := make([]int, 0, len(entries))
	for _, e := range entries {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

// Policy is thread tid's scheduling policy (unix.SCHED_*).
func Policy(tid int) (uint32, error) {
	attr, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		return 0, err
	}
	return attr.Policy, nil
}
