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
		st, notice := interruptProduce(t, addr, 10*time.Minute, n, 0, nil)
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
	t.Run("flushing", func(t *testing.T) {
		// The input has ended and its last records cannot be delivered (their node is gone): an
		// interrupt during that flush is told the same, and the records fail at the delivery timeout.
		n2, addr2 := startNodeHandle(t)
		mustCLI(t, "", "topic", "create", "interrupted", "-p", "2", "--brokers="+addr2)
		st, notice := interruptProduce(t, addr2, 10*time.Minute, n, 0, func() {
			if err := n2.Close(); err != nil {
				t.Errorf("close node: %v", err)
			}
		})
		want := "interrupted: stopped reading input; delivering the 3 records already read (up to the delivery timeout, 8s); interrupt again to quit without waiting\n"
		if notice != want {
			t.Fatalf("notice %q, want %q", notice, want)
		}
		if a, f := st.acked.Load(), st.failed.Load(); a != 0 || f != n {
			t.Fatalf("%d acknowledged and %d failed, want 0 and %d", a, f, n)
		}
	})
	t.Run("delivered", func(t *testing.T) {
		st, notice := interruptProduce(t, addr, 0, n, n, nil)
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
// With beforeEnd, it then runs beforeEnd, ends the input and interrupts only once the run's last
// flush has started; the producer's delivery timeout is then 8 s, which leaves the node's close time
// before the records expire.
func interruptProduce(t *testing.T, addr string, linger time.Duration, lines, acked int64, beforeEnd func()) (*produceStats, string) {
	t.Helper()
	deliveryTimeout := client.DefaultProducer().DeliveryTimeout
	if beforeEnd != nil {
		deliveryTimeout = 8 * time.Second
	}
	opts := []client.ProducerOption{client.WithLinger(linger), client.WithAcks(client.AcksAll), client.WithDeliveryTimeout(deliveryTimeout)}
	p, err := client.NewProducer([]string{addr}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var notice bytes.Buffer
	inputEnded := make(chan struct{})
	lp := lineProducer{topic: "interrupted", partition: -1, notice: &notice, deliveryTimeout: deliveryTimeout,
		onInputEnd: func() { close(inputEnded) }}
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
	if beforeEnd != nil {
		beforeEnd()
		pw.Close()
		select {
		case <-inputEnded:
		case <-time.After(10 * time.Second):
			t.Fatal("the run did not see its input end")
		}
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
