//go:build !linux

package cede

import "runtime"

// yield elsewhere lets the goroutine's peers run; the kernel-queue effect
// cede exists for was measured on Linux only.
var yield = runtime.Gosched
