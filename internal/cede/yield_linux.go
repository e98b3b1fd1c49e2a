package cede

import "syscall"

// yield is sched_yield(2) through the runtime's syscall entry, so the P is
// handed off if the thread stays off its core for long.
var yield = func() { _, _, _ = syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
