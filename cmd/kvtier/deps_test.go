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
