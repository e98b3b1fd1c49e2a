// Package proc ties the processes kvtier's harnesses start (the S3 test
// server, benchmark and chaos children) to the process that started them,
// so none outlives it: not on a panic, not on a SIGKILL of the harness. It
// owns no state.
package proc

import (
	"os/exec"
	"syscall"
)

// DieWithParent makes cmd's process receive SIGKILL when the starting
// process dies (Linux's parent-death signal). Call it before cmd.Start.
//
// NB: the signal follows the OS thread that forks, and the Go runtime keeps
// its threads for the life of the process (nothing here locks one), so in
// practice it fires when the harness process ends.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
