// Command kvtier is the kvtier command-line tool: the engine simulator
// (`kvtier sim`), the benchmark scenarios (`kvtier bench`), the chaos
// harness (`kvtier chaos`), `kvtier events tail` and `kvtier fleet status`.
// It links the test helpers (internal/testutil) the benchmarks start real
// servers with; the daemon, cmd/kvtierd, links none of them.
// It only parses flags and wires library packages together; the logic lives
// in internal/ and the node behind the root package (node).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/internal/version"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kvtier:", err)
		os.Exit(1)
	}
}

// newRootCmd builds the command tree.
func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "kvtier",
		Short:         "kvtier tools: engine simulator and friends",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version.Get().String(),
	}
	root.SetVersionTemplate("kvtier {{.Version}}\n")
	root.AddCommand(newSimCmd(), newBenchCmd())
	root.AddCommand(newSizeCmd())                  // size.go
	root.AddCommand(newStatusCmd(), newClearCmd()) // status.go
	root.AddCommand(newEventsCmd())
	root.AddCommand(newChaosCmd()) // chaos.go
	root.AddCommand(newFleetCmd()) // fleet.go
	return root
}

// withCommands adds subs to cmd and returns it.
func withCommands(cmd *cobra.Command, subs ...*cobra.Command) *cobra.Command {
	cmd.AddCommand(subs...)
	return cmd
}

// untilInterrupted is ctx (nil: the background), cancelled also by SIGINT
// or SIGTERM until stop is called: how a command's run ends early.
func untilInterrupted(ctx context.Context) (_ context.Context, stop context.CancelFunc) {
	if ctx == nil {
		ctx = context.Background()
	}
	return signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
}
