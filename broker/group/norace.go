//go:build !race

package group

// raceBuild reports a -race build, where invariants are checked.
const raceBuild = false
