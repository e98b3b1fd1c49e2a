package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestShippedBinariesLinkNoTestingPackage: the daemon and the CLI are the
// product; test helpers they reach (the bench's test servers) must not pull
// in package testing.
func TestShippedBinariesLinkNoTestingPackage(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/kvtier/kvtier/cmd/kvtierd",
		"github.com/kvtier/kvtier/cmd/kvtier").Output()
	if err != nil {
		t.Skipf("go list unavailable: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "testing" {
			t.Fatal("a shipped binary links package testing (go list -deps ./cmd/kvtierd ./cmd/kvtier)")
		}
	}
}

// TestDaemonLinksNoTestHelper: the daemon links none of the helpers that
// start test servers (internal/testutil, the object tier's versitygw
// runner): only the tool's benchmarks use them.
func TestDaemonLinksNoTestHelper(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/kvtier/kvtier/cmd/kvtierd").Output()
	if err != nil {
		t.Skipf("go list unavailable: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.Contains(p, "/internal/testutil/") || strings.HasSuffix(p, "/objtest") || strings.HasSuffix(p, "/internal/bench") {
			t.Fatalf("kvtierd links %s (go list -deps ./cmd/kvtierd)", p)
		}
	}
}
