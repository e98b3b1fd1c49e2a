//go:build race

package chaos

// raceScale stretches the suite's runs under the race detector, which
// slows the node and the engines several times over: a run needs its
// seconds of traffic for every fault kind to come up.
const raceScale = 2
