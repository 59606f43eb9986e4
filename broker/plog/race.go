//go:build race

package plog

// raceBuild reports a -race build; see Store.runGC.
const raceBuild = true
