package meta

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
)

// FSM holds the current Image of a node and applies the metadata log to it. It satisfies
// platform/quorum's StateMachine (Apply, Snapshot, Restore are called on raft's one FSM goroutine);
// any goroutine reads Image and waits with Changed or WaitFor.
type FSM struct {
	log *slog.Logger
	cur atomic.Pointer[Image]

	mu      sync.Mutex
	changed chan struct{} // closed and replaced at every new image
}

// NewFSM returns an FSM at the empty image.
func NewFSM(logger *slog.Logger) *FSM {
	if logger == nil {
		logger = slog.Default()
	}
	f := &FSM{log: logger, changed: make(chan struct{})}
	f.cur.Store(Empty())
	return f
}

// Image returns the current image; it never changes, a later one replaces it.
func (f *FSM) Image() *Image { return f.cur.Load() }

// Changed returns a channel closed when the next image replaces the current one.
func (f *FSM) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

func (f *FSM) publish(m *Image) {
	f.cur.Store(m)
	f.mu.Lock()
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
}

// WaitFor waits until the image has applied the metadata log up to offset, and returns it. Errors:
// ctx's.
func (f *FSM) WaitFor(ctx context.Context, offset uint64) (*Image, error) {
	for {
		ch := f.Changed()
		if m := f.Image(); m.Offset >= offset {
			return m, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Apply decodes and applies one committed entry and returns its Result. An entry that does not decode
// (written by a newer version, or damaged) is skipped on every node alike, so the images stay equal.
func (f *FSM) Apply(index uint64, data []byte) any {
	cmd, err := DecodeCommand(data)
	if err != nil {
		f.log.Error("skipping metadata log entry", "offset", index, "err", err)
		m := *f.Image()
		m.Offset = index
		f.publish(&m)
		return Result{Err: err}
	}
	m, res := Apply(f.Image(), index, cmd)
	f.publish(m)
	return res
}

// Snapshot returns the current image encoded.
func (f *FSM) Snapshot() ([]byte, error) { return f.Image().Encode() }

// Restore replaces the image with a snapshot taken at index.
func (f *FSM) Restore(index uint64, data []byte) error {
	m, err := DecodeImage(data)
	if err != nil {
		return err
	}
	m.Offset = index
	f.publish(m)
	return nil
}
