package platformtest

import (
	"fmt"
	"testing"
)

// outcomeTB records whether SharedData skipped or failed, without ending the test.
type outcomeTB struct {
	testing.TB
	skipped, failed string
}

func (o *outcomeTB) Helper()                        {}
func (o *outcomeTB) Skipf(format string, a ...any)  { o.skipped = fmt.Sprintf(format, a...) }
func (o *outcomeTB) Fatalf(format string, a ...any) { o.failed = fmt.Sprintf(format, a...) }

// TestSharedDataMissing: a missing data set skips a test, except under RUNNEL_LONG=1 (make test-long),
// where it fails it, so the long target cannot pass having run nothing.
func TestSharedDataMissing(t *testing.T) {
	t.Setenv("RUNNEL_LONG", "")
	o := &outcomeTB{TB: t}
	SharedData(o, "no-such-data-set")
	if o.skipped == "" || o.failed != "" {
		t.Fatalf("without RUNNEL_LONG: skipped %q, failed %q; want a skip", o.skipped, o.failed)
	}
	t.Setenv("RUNNEL_LONG", "1")
	o = &outcomeTB{TB: t}
	SharedData(o, "no-such-data-set")
	if o.failed == "" || o.skipped != "" {
		t.Fatalf("with RUNNEL_LONG=1: skipped %q, failed %q; want a failure", o.skipped, o.failed)
	}
}
