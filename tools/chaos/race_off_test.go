//go:build !race

package chaos

// raceScale stretches the suite's runs under the race detector (1 without).
const raceScale = 1
