package membership

import (
	"testing"
	"time"

	"github.com/runnel-io/runnel/internal/testaddr"
	"github.com/runnel-io/runnel/platform/netmap"
)

// TestJoinThroughRewrite: node 2 knows node 1 only by an address nothing listens on, which its rewrite
// table (Config.Rewrite, the e2e fault proxies' hook) maps to node 1: it joins, and both see each other
// alive, so the table reaches memberlist's transport.
func TestJoinThroughRewrite(t *testing.T) {
	t.Parallel()
	n1 := start(t, testConfig(t, 1))
	ghost := testaddr.Free(t)
	tb, err := netmap.Parse(ghost + "=" + n1.LocalAddr())
	if err != nil {
		t.Fatal(err)
	}
	c2 := testConfig(t, 2, ghost)
	c2.Rewrite = tb
	n2 := start(t, c2)
	if !n2.Joined() {
		t.Fatal("node 2 did not join through the rewrite")
	}
	waitFor(t, 5*time.Second, "both to see 2 alive members", func() bool { return allAlive(n1, 2) && allAlive(n2, 2) })
}
