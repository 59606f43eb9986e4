package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/runnel-io/runnel/client"
)

// The txn verbs, `consume --isolation` and `bench produce --transactional` end to end: a transactional
// bench run commits and its records are read committed; a transaction left open shows in describe,
// holds read_committed readers back, and `txn abort` ends it (its record never read committed) and
// fences its producer.
func TestCLITransactions(t *testing.T) {
	addr := startNode(t)
	b := "--brokers=" + addr
	mustCLI(t, "", "topic", "create", "tx", "-p", "2", b)

	for _, args := range [][]string{
		{"consume", "tx", "--isolation", "serializable"},
		{"bench", "produce", "--topic", "tx", "--txn-interval", "10ms", "--count", "1"},
		{"bench", "produce", "--topic", "tx", "--transactional", "--acks", "1", "--count", "1"},
		{"txn", "describe"},
		{"txn", "abort"},
	} {
		if r := runCLI(t, "", append(args, b)...); r.code != 2 {
			t.Errorf("runnel %s: exit %d, want 2 (usage); stderr %s", strings.Join(args, " "), r.code, r.stderr)
		}
	}

	var res benchResult
	out := mustCLI(t, "", "bench", "produce", "--topic", "tx", "--transactional", "--txn-interval", "20ms", "--count", "3000", "-q", "-o", "json", b).stdout
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench output %q: %v", out, err)
	}
	if !res.Transactional || res.Records != 3000 || res.Errors != 0 || res.Commits < 1 || res.CommitsPerSec <= 0 {
		t.Fatalf("transactional bench: %+v", res)
	}
	if got := parseJSONLines(t, mustCLI(t, "", "consume", "tx", "--isolation", "read_committed", "--end", "-o", "json", b).stdout); len(got) != 3000 {
		t.Fatalf("read_committed after the bench: %d records, want 3000", len(got))
	}

	// One plain record in each partition, so both have records to read whichever partitions the
	// bench's sticky partitioner filled.
	plain, err := client.NewProducer([]string{addr})
	if err != nil {
		t.Fatal(err)
	}
	for part := int32(0); part < 2; part++ {
		r := client.NewRecord("tx", nil, []byte("plain"))
		r.Partition = part
		if err := plain.ProduceSync(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	plain.Close()

	// A transaction left open by a producer that went away (not closed: Close would abort it).
	p, err := client.NewProducer([]string{addr}, client.WithTransactionalID("stuck"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.InitTransactions(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	r := client.NewRecord("tx", nil, []byte("stuck"))
	r.Partition = 1
	if err := p.ProduceSync(ctx, r); err != nil {
		t.Fatal(err)
	}

	var list []txnSummaryView
	if err := json.Unmarshal([]byte(mustCLI(t, "", "txn", "list", "-o", "json", b).stdout), &list); err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, s := range list {
		states[s.TransactionalID] = s.State
	}
	if states["stuck"] != "Ongoing" || len(states) != 2 {
		t.Fatalf("txn list: %+v", list)
	}
	var d txnView
	if err := json.Unmarshal([]byte(mustCLI(t, "", "txn", "describe", "stuck", "-o", "json", b).stdout), &d); err != nil {
		t.Fatal(err)
	}
	pid, epoch := p.ProducerID()
	if d.State != "Ongoing" || d.ProducerID != pid || d.ProducerEpoch != epoch || d.AgeMs == nil || d.TimeoutMs != 60000 ||
		len(d.Partitions) != 1 || d.Partitions[0] != (partitionRef{"tx", 1}) {
		t.Fatalf("txn describe stuck: %+v", d)
	}
	if table := mustCLI(t, "", "txn", "describe", "stuck", b).stdout; !strings.Contains(table, "tx:1") || !strings.Contains(table, "Ongoing") {
		t.Fatalf("txn describe table:\n%s", table)
	}
	// Partition 0 has no open transaction: read_committed reads it to its end.
	if got := parseJSONLines(t, mustCLI(t, "", "consume", "tx", "--isolation", "read_committed", "-p", "0", "--end", "-o", "json", b).stdout); len(got) == 0 {
		t.Fatal("partition 0 (no open transaction) read nothing")
	}

	// A read_committed reader to the end of partition 1 waits for the open transaction, and ends once it
	// is aborted, although the abort brings it no record (only the aborted one and a marker).
	waiting := make(chan cliResult, 1)
	go func() {
		waiting <- runCLI(t, "", "consume", "tx", "--isolation", "read_committed", "-p", "1", "--end", "-o", "json", b)
	}()
	select {
	case r := <-waiting:
		t.Fatalf("consume --end returned while the transaction was open: exit %d, %s", r.code, r.stderr)
	case <-time.After(time.Second):
	}

	var ab txnAbortView
	if err := json.Unmarshal([]byte(mustCLI(t, "", "txn", "abort", "stuck", "-o", "json", b).stdout), &ab); err != nil {
		t.Fatal(err)
	}
	if ab.ProducerID != pid || ab.ProducerEpoch <= epoch {
		t.Fatalf("txn abort: %+v (producer %d epoch %d before)", ab, pid, epoch)
	}
	select {
	case r := <-waiting:
		if r.code != 0 || len(parseJSONLines(t, r.stdout)) == 0 {
			t.Fatalf("consume --end after the abort: exit %d, stdout %q, stderr %s", r.code, r.stdout, r.stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("consume --isolation read_committed --end did not end within 20 s of the abort")
	}
	// The aborted record is never read committed, and read uncommitted it is there.
	if got := parseJSONLines(t, mustCLI(t, "", "consume", "tx", "--isolation", "read_committed", "--end", "-o", "json", b).stdout); len(got) != 3002 {
		t.Fatalf("read_committed after the abort: %d records, want 3002", len(got))
	}
	if got := parseJSONLines(t, mustCLI(t, "", "consume", "tx", "--end", "-o", "json", b).stdout); len(got) != 3003 {
		t.Fatalf("read_uncommitted after the abort: %d records, want 3003", len(got))
	}
	// Its producer is fenced.
	if err := p.CommitTransaction(ctx); !errors.Is(err, client.ErrProducerFenced) {
		t.Fatalf("commit of the aborted transaction: %v", err)
	}
	p.Close()
}
