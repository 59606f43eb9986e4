package platform_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/platform"
)

// TestMetricsTransactions: /metrics counts the transaction coordinator's decisions. With one
// transaction ongoing, open is 1; after it commits and a second one aborts, committed and aborted
// (reason client) are 1 and 1, open is back at 0, and the duration histogram has one sample of each
// outcome. Then a transaction fenced by a new producer of its id and one that outlives its timeout
// count as aborted with reasons fenced and timeout.
func TestMetricsTransactions(t *testing.T) {
	tn := startNode(t, t.TempDir(), func(c *platform.Config) { c.Transactions.TickInterval = 50 * time.Millisecond })
	tn.createTopic(t, "tx", 1, nil)
	addr, httpAddr := tn.node.GRPCAddr(), tn.node.HTTPAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	metric := func(name, labels string) float64 { return scrape(t, httpAddr, name)[labels] }
	waitMetric := func(name, labels string, want float64) {
		t.Helper()
		waitFor(t, 20*time.Second, func() string {
			if got := metric(name, labels); got != want {
				return fmt.Sprintf("%s%s = %v, want %v", name, labels, got, want)
			}
			return ""
		})
	}
	newTxnProducer := func(id string, opts ...client.ProducerOption) *client.Producer {
		t.Helper()
		p, err := client.NewProducer([]string{addr}, append([]client.ProducerOption{client.WithTransactionalID(id),
			client.WithAcks(client.AcksAll)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		if err := p.InitTransactions(ctx); err != nil {
			t.Fatal(err)
		}
		return p
	}
	produceIn := func(p *client.Producer, v string) {
		t.Helper()
		if err := p.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := p.ProduceSync(ctx, &client.Record{Topic: "tx", Partition: 0, Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
	}

	p := newTxnProducer("app")
	waitMetric("runnel_transactions_open", "", 0) // the gauge is there, at 0, once the coordinator runs
	produceIn(p, "committed")
	waitMetric("runnel_transactions_open", "", 1)
	if err := p.CommitTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	produceIn(p, "aborted")
	if err := p.AbortTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	waitMetric("runnel_transactions_open", "", 0) // markers written, both COMPLETE_*
	if got := metric("runnel_transactions_committed_total", ""); got != 1 {
		t.Errorf("committed %v, want 1", got)
	}
	if got := metric("runnel_transactions_aborted_total", `{runnel_txn_abort_reason="client"}`); got != 1 {
		t.Errorf("aborted by the client %v, want 1 (all: %v)", got, scrape(t, httpAddr, "runnel_transactions_aborted_total"))
	}
	for _, outcome := range []string{"commit", "abort"} {
		if got := metric("runnel_transaction_duration_seconds_count", fmt.Sprintf(`{runnel_txn_outcome=%q}`, outcome)); got != 1 {
			t.Errorf("%s durations %v, want 1", outcome, got)
		}
	}

	// A new producer of the id aborts the old one's ongoing transaction and fences it.
	produceIn(p, "fenced")
	newTxnProducer("app")
	waitMetric("runnel_transactions_aborted_total", `{runnel_txn_abort_reason="fenced"}`, 1)

	// A transaction past its timeout is aborted by the coordinator's timer.
	slow := newTxnProducer("slow", client.WithTransactionTimeout(300*time.Millisecond))
	produceIn(slow, "timed out")
	waitMetric("runnel_transactions_aborted_total", `{runnel_txn_abort_reason="timeout"}`, 1)
	waitMetric("runnel_transactions_open", "", 0)
	if got := metric("runnel_transactions_committed_total", ""); got != 1 {
		t.Errorf("committed %v after the aborts, want still 1", got)
	}
	if got := metric("runnel_transactions_aborted_total", `{runnel_txn_abort_reason="client"}`); got != 1 {
		t.Errorf("aborted by the client %v after the others, want still 1", got)
	}
}
