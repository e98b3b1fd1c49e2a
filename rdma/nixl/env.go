//go:build nixl && cgo

package nixl

import "os"

// getenv is os.Getenv; a variable so tests can pin the environment.
var getenv = os.Getenv
