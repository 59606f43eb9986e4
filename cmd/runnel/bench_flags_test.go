package main

import (
	"strings"
	"testing"
)

// TestBenchProduceFlagErrors: bench produce refuses bad producer settings as usage errors (exit 2) that
// name the flag, before it contacts any broker, and explains "--keys N", which pflag reads as --keys
// at its default followed by an argument.
func TestBenchProduceFlagErrors(t *testing.T) {
	const nowhere = "--brokers=127.0.0.1:1" // nothing listens: a command that got that far would fail otherwise
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "produce", nowhere, "--keys", "500"}, `--keys takes a value only after "=": --keys=500`},
		{[]string{"bench", "produce", nowhere, "--buffer-bytes", "0"}, "--buffer-bytes 0: must be at least the batch size, --batch-bytes (1048576)"},
		{[]string{"bench", "produce", nowhere, "--batch-bytes", "65536", "--buffer-bytes", "1000"}, "--buffer-bytes 1000: must be at least the batch size, --batch-bytes (65536)"},
		{[]string{"bench", "produce", nowhere, "--max-in-flight", "0"}, "--max-in-flight 0: must be at least 1"},
		{[]string{"bench", "produce", nowhere, "--batch-bytes", "0"}, "--batch-bytes must be positive"},
	} {
		r := runCLI(t, "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("runnel %s: exit %d, stderr %q; want exit 2 and %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.want)
		}
	}
	// A surplus argument with no optional-value flag before it gets no hint.
	r := runCLI(t, "", "bench", "produce", nowhere, "extra")
	if r.code != 2 || strings.Contains(r.stderr, "takes a value only after") {
		t.Errorf("runnel bench produce extra: exit %d, stderr %q", r.code, r.stderr)
	}
}
