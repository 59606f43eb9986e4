package group

import "testing"

// invariantsOn makes the coordinator check its invariants after every call and panic on a violation
// (see Coordinator.Check), as pebble's invariants builds do: on in tests and in -race builds, off in
// production, where the check would walk every partition of every group on every call.
var invariantsOn = raceBuild || testing.Testing()
