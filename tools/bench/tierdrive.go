package bench

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/tiers/blockfmt"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

// tierDrive is one secondary tier under test: how to spawn its actor and
// how to close it after the actor stopped.
type tierDrive struct {
	name       string
	props      *actor.Props
	close      func(context.Context) error
	blockBytes int
	blocks     int          // blocks written, then read back
	window     int          // operations in flight
	beforeRead func() error // between the phases (e.g. drop the page cache); nil: nothing
	cpu        *phaseCPU    // if set, filled with the process's CPU time in each phase
}

// phaseCPU is the CPU time (user and system, every goroutine of the
// process) a write phase and a read phase took.
type phaseCPU struct{ write, read time.Duration }

// processCPU is the user and system CPU time this process has used so far
// (0 where getrusage fails).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// driveTier writes d.blocks blocks (src cycled, each with its CRC32C)
// through the tier's actor, keeping d.window in flight, then reads them all
// back, and returns each phase's wall time. Every answer must be a success.
func driveTier(ctx context.Context, d tierDrive, src [][]byte) (write, read time.Duration, err error) {
	system := actors.NewSystem(zerolog.Nop())
	defer system.Shutdown()
	pid, err := system.Root.SpawnNamed(d.props, d.name)
	if err != nil {
		return 0, 0, errors.Join(err, d.close(ctx))
	}
	defer func() {
		err = errors.Join(err, actors.StopAndWait(ctx, system, pid), d.close(ctx))
	}()
	sums := make([]uint32, len(src))
	for i, b := range src {
		sums[i] = crc32.Checksum(b, blockfmt.Castagnoli)
	}
	results := make(chan any, d.window)
	collector, err := system.Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
		switch m := c.Message().(type) {
		case *tiermsg.WriteResult, *tiermsg.ReadResult:
			results <- m
		}
	}), "collector")
	if err != nil {
		return 0, 0, err
	}
	defer system.Root.Stop(collector)
	po := FSOptions{Blocks: d.blocks, Window: d.window}
	cpu0 := processCPU()
	write, err = pipeline(ctx, po, results, func(i, slot int) {
		system.Root.RequestWithCustomSender(pid, &tiermsg.Write{Corr: uint64(slot), Key: fsBenchKey(i),
			Src: src[i%len(src)], Checksum: sums[i%len(src)]}, collector)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("%s write: %w", d.name, err)
	}
	cpuWrite := processCPU() - cpu0
	dests := make([][]byte, d.window)
	for i := range dests {
		dests[i] = make([]byte, d.blockBytes)
	}
	if d.beforeRead != nil {
		if err := d.beforeRead(); err != nil {
			return 0, 0, err
		}
	}
	cpu0 = processCPU()
	read, err = pipeline(ctx, po, results, func(i, slot int) {
		system.Root.RequestWithCustomSender(pid, &tiermsg.Read{Corr: uint64(slot), Key: fsBenchKey(i), Dest: dests[slot]}, collector)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("%s read: %w", d.name, err)
	}
	if d.cpu != nil {
		*d.cpu = phaseCPU{write: cpuWrite, read: processCPU() - cpu0}
	}
	return write, read, nil
}
