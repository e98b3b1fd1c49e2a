// Command writer is a test helper for the Python reader's cross-language
// tests (clients/python/tests/test_residency.py): it writes a residency
// index the way the daemon does, from a second process. It ships nowhere.
//
// Keys: namespace "vllm-test", hash sha256 of the decimal string of i for i
// in 0..31, group i%2.
//
//	--mode fixed: two regions (capacity 64 each); even i in region 0 with
//	  state 1, odd i in region 1 with state 2. Prints "ready", waits for
//	  stdin to close, closes the index (removing the file), exits 0.
//	--mode churn --iterations N: one region (capacity 64). Prints "ready",
//	  waits for one line on stdin (so the reader is mapped before the churn
//	  starts), then N times over the keys: withdraw key i when (n+i)%3 == 0,
//	  else publish it with state 1+(n+i)%2. Prints "done", waits for stdin to
//	  close, closes, exits 0.
package main

import (
	"bufio"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/kvtier/kvtier/tiers/cpu/residency"
)

const (
	namespace = "vllm-test"
	nkeys     = 32
)

func main() {
	path := flag.String("path", "", "index file to create")
	mode := flag.String("mode", "fixed", "fixed or churn")
	iterations := flag.Int("iterations", 1000, "churn rounds over the key set")
	flag.Parse()
	if err := run(*path, *mode, *iterations); err != nil {
		fmt.Fprintln(os.Stderr, "writer:", err)
		os.Exit(2)
	}
}

func run(path, mode string, iterations int) error {
	if path == "" {
		return fmt.Errorf("--path is required")
	}
	in := bufio.NewReader(os.Stdin)
	switch mode {
	case "fixed":
		return fixed(path, in)
	case "churn":
		return churn(path, iterations, in)
	}
	return fmt.Errorf("unknown --mode %q", mode)
}

// fingerprints are the documented test keys' fingerprints.
func fingerprints() []uint64 {
	nsfp := residency.NamespaceFingerprint(namespace)
	fps := make([]uint64, nkeys)
	for i := range fps {
		h := sha256.Sum256([]byte(strconv.Itoa(i)))
		fps[i] = residency.FingerprintWith(nsfp, h[:], uint32(i%2))
	}
	return fps
}

func fixed(path string, in *bufio.Reader) error {
	idx, err := residency.Create(path, []int{64, 64})
	if err != nil {
		return err
	}
	for i, fp := range fingerprints() {
		if !idx.Region(i%2).Publish(fp, fixedState(i)) {
			idx.Close()
			return fmt.Errorf("key %d dropped", i)
		}
	}
	fmt.Println("ready")
	io.Copy(io.Discard, in)
	return idx.Close()
}

// fixedState is test key i's state in the fixed index: odd keys held in a
// secondary tier (region 1); even keys in region 0, readable, or every
// other one being written.
func fixedState(i int) uint8 {
	switch {
	case i%2 == 1:
		return residency.StateSecondary
	case i%4 == 2:
		return residency.StateWriting
	}
	return residency.StateCPU
}

func churn(path string, iterations int, in *bufio.Reader) error {
	idx, err := residency.Create(path, []int{64})
	if err != nil {
		return err
	}
	fmt.Println("ready")
	in.ReadString('\n')
	fps, r := fingerprints(), idx.Region(0)
	for n := 0; n < iterations; n++ {
		for i, fp := range fps {
			if (n+i)%3 == 0 {
				r.Withdraw(fp)
			} else if !r.Publish(fp, uint8(1+(n+i)%2)) {
				idx.Close()
				return fmt.Errorf("key %d dropped", i)
			}
		}
	}
	fmt.Println("done")
	io.Copy(io.Discard, in)
	return idx.Close()
}
