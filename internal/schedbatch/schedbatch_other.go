//go:build !linux

package schedbatch

// Apply does nothing off Linux: the policy is Linux's.
func Apply() (string, error) { return "normal", nil }
