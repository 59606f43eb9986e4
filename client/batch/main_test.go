package batch

import (
	"testing"

	"go.uber.org/goleak"
)

// The pooled compressors must not leave goroutines behind (zstd's stream mode would).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
