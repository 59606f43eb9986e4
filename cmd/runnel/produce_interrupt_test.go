package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/runnel-io/runnel/client"
)

// TestProduceInterruptNamesTheWait checks what an interrupted produce run says and does: it stops
// reading, tells the user how many records it is still delivering and how to quit at once, and
// delivers them; with nothing left to deliver it says nothing. In the first case a long linger keeps
// every record unanswered until the interrupt, so the count is known.
func TestProduceInterruptNamesTheWait(t *testing.T) {
	addr := startNode(t)
	mustCLI(t, "", "topic", "create", "interrupted", "-p", "2", "--brokers="+addr)
	const n = 3
	t.Run("pending", func(t *testing.T) {
		st, notice := interruptProduce(t, addr, 10*time.Minute, n, 0)
		want := "interrupted: stopped reading input; delivering the 3 records already read (up to the delivery timeout, 2m0s); interrupt again to quit without waiting\n"
		if notice != want {
			t.Fatalf("notice %q, want %q", notice, want)
		}
		if a, f := st.acked.Load(), st.failed.Load(); a != n || f != 0 {
			t.Fatalf("after the interrupt %d acknowledged and %d failed, want %d and 0", a, f, n)
		}
		err := st.result(canceledContext(), nil)
		if err == nil || !strings.Contains(err.Error(), "records read so far were delivered") {
			t.Fatalf("result %v, want the interrupt's exit", err)
		}
	})
	t.Run("delivered", func(t *testing.T) {
		st, notice := interruptProduce(t, addr, 0, n, n)
		if notice != "" {
			t.Fatalf("notice %q with every record delivered, want none", notice)
		}
		if a := st.acked.Load(); a != n {
			t.Fatalf("%d acknowledged, want %d", a, n)
		}
	})
}

// interruptProduce runs a lineProducer on a pipe, writes lines records, waits until all are read and
// acked of them acknowledged, interrupts the run and returns its counts and notice once it returned.
func interruptProduce(t *testing.T, addr string, linger time.Duration, lines, acked int64) (*produceStats, string) {
	t.Helper()
	p, err := client.NewProducer([]string{addr}, client.WithLinger(linger), client.WithAcks(client.AcksAll))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var notice bytes.Buffer
	lp := lineProducer{topic: "interrupted", partition: -1, notice: &notice, deliveryTimeout: 2 * time.Minute}
	pr, pw := io.Pipe()
	defer pw.Close()
	in, err := openInput("", pr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := new(produceStats)
	done := make(chan error, 1)
	go func() { done <- lp.run(ctx, p, in, st) }()
	for i := range lines {
		if _, err := fmt.Fprintf(pw, "line %d\n", i); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); st.read.Load() < lines || st.acked.Load() < acked; {
		if time.Now().After(deadline) {
			t.Fatalf("read %d of %d lines, %d of %d acknowledged", st.read.Load(), lines, st.acked.Load(), acked)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if a := st.acked.Load(); a != acked {
		t.Fatalf("%d records acknowledged before the interrupt, want %d", a, acked)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after the interrupt")
	}
	return st, notice.String()
}

// canceledContext is a context that has ended, as the command's is after an interrupt.
func canceledContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}
