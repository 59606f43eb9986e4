package main

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// progress prints, about once a second on stderr, how far a produce run is: records and bytes
// acknowledged, the rate, and how much of the input file has been read. On a terminal it redraws one
// line; otherwise it writes a line each time.
type progress struct {
	w       io.Writer
	tty     bool
	label   string
	in      *input
	records *atomic.Int64
	bytes   *atomic.Int64
	start   time.Time
	stop    chan struct{}
	wg      sync.WaitGroup
}

// startProgress starts the ticker; records and bytes are read at each tick. Stop ends it.
func startProgress(w io.Writer, label string, in *input, records, bytes *atomic.Int64) *progress {
	p := &progress{w: w, tty: isTerminal(w), label: label, in: in, records: records, bytes: bytes,
		start: time.Now(), stop: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.print()
			}
		}
	}()
	return p
}

func (p *progress) line() string {
	n, b := p.records.Load(), p.bytes.Load()
	el := time.Since(p.start)
	s := fmt.Sprintf("%s: %s records  %s  %s records/s", p.label, comma(n), mb(b), comma(int64(rate(n, el))))
	if f := p.in.fraction(); p.in != nil && f >= 0 {
		s += fmt.Sprintf("  %.0f%% of file", f*100)
	}
	return s
}

func (p *progress) print() {
	if p.tty {
		fmt.Fprintf(p.w, "\r%s\033[K", p.line())
	} else {
		fmt.Fprintln(p.w, p.line())
	}
}

// Stop ends the ticker and clears the redrawn line.
func (p *progress) Stop() {
	close(p.stop)
	p.wg.Wait()
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
