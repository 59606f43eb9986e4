//go:build race

package e2e

// This file makes TestMain build the node binary with the race detector when the tests run with it,
// so the multi-node code paths (controller, membership, forwarding) are race-checked too.
func init() { buildFlags = append(buildFlags, "-race") }
