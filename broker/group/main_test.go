package group

import (
	"flag"
	"os"
	"testing"
)

// TestMain lengthens rapid's histories from its default of 30 steps to 200 (unless -rapid.steps is
// given): ownership bugs need a few joins, revocations and timeouts in a row to show, and the core is
// fast enough that 100 histories of 200 steps take seconds.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.steps" })
	if !set {
		_ = flag.Set("rapid.steps", "200")
	}
	os.Exit(m.Run())
}
