package quorum

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// StateMachine is the replicated state. Apply must be deterministic (no clock, no randomness, no I/O
// that can fail differently on different nodes): every node applies the same entries in the same order
// (the Raft paper's replicated state machine, §2), so every node ends in the same state.
//
// Apply, Snapshot and Restore are called from one goroutine, never concurrently with each other.
type StateMachine interface {
	// Apply applies one committed entry. index is its raft log index (strictly increasing, with gaps
	// where raft has entries of its own). The result is handed to the Propose call that proposed it
	// (on the leader); other nodes drop it.
	Apply(index uint64, data []byte) any
	// Snapshot returns the whole state as bytes; called on raft's FSM goroutine, so no Apply runs
	// concurrently. The bytes must not change afterwards (they are written out while Apply goes on).
	Snapshot() ([]byte, error)
	// Restore replaces the state with a snapshot taken at index (the state after applying every entry
	// up to index). It is called at Start when Dir has a snapshot, and when the leader sends one to a
	// follower that is too far behind.
	Restore(index uint64, data []byte) error
}

// Entry tags, kept in raft.Log.Extensions (replicated and stored with the entry, never shown to the
// state machine): one version byte, one kind byte, the proposing Quorum's random nonce and the
// proposal's sequence number. The nonce tells a proposal of this process from one of an earlier run or
// of another node that happens to have the same sequence number.
const (
	extVersion = 1
	extLen     = 2 + 8 + 8

	kindCommand = 0 // data for StateMachine.Apply
	kindBarrier = 1 // no data; applied by the shell only
)

// encodeExt returns the tag of proposal seq of the Quorum with nonce.
func encodeExt(kind byte, nonce, seq uint64) []byte {
	b := make([]byte, extLen)
	b[0], b[1] = extVersion, kind
	binary.BigEndian.PutUint64(b[2:], nonce)
	binary.BigEndian.PutUint64(b[10:], seq)
	return b
}

// decodeExt parses a tag; ok is false for an entry without one (which is applied as a command).
func decodeExt(b []byte) (kind byte, nonce, seq uint64, ok bool) {
	if len(b) != extLen || b[0] != extVersion {
		return 0, 0, 0, false
	}
	return b[1], binary.BigEndian.Uint64(b[2:]), binary.BigEndian.Uint64(b[10:]), true
}

// Snapshot bytes: magic, then the big-endian index the state was taken at, then the state machine's
// bytes.
var snapMagic = [4]byte{'R', 'N', 'Q', '1'}

const snapHeaderLen = 4 + 8

// applyResult is what a waiting proposal receives.
type applyResult struct {
	result any
	index  uint64
}

// fsm adapts a StateMachine to raft.FSM. It keeps the applied index, wakes WaitApplied waiters and
// hands results to the proposals waiting for them.
type fsm struct {
	sm    StateMachine
	nonce uint64

	applied atomic.Uint64
	mu      sync.Mutex
	// advanced is closed (and set to nil) when applied moves; nil when nobody waits.
	advanced chan struct{}
	// pending maps a proposal's sequence number to the channel (buffered 1) it waits on.
	pending map[uint64]chan applyResult
	// restores counts Restore calls (tests).
	restores atomic.Int64
}

var _ raft.FSM = (*fsm)(nil)

func newFSM(sm StateMachine, nonce uint64) *fsm {
	return &fsm{sm: sm, nonce: nonce, pending: make(map[uint64]chan applyResult)}
}

// Apply implements raft.FSM. raft calls it for LogCommand entries only, in log order.
func (f *fsm) Apply(l *raft.Log) any {
	kind, nonce, seq, tagged := decodeExt(l.Extensions)
	var res any
	if !tagged || kind != kindBarrier {
		res = f.sm.Apply(l.Index, l.Data)
	}
	f.mu.Lock()
	f.applied.Store(l.Index)
	if f.advanced != nil {
		close(f.advanced)
		f.advanced = nil
	}
	if tagged && nonce == f.nonce {
		if ch, ok := f.pending[seq]; ok {
			ch <- applyResult{result: res, index: l.Index}
			delete(f.pending, seq)
		}
	}
	f.mu.Unlock()
	return res
}

// register makes the result of proposal seq go to the returned channel.
func (f *fsm) register(seq uint64) chan applyResult {
	ch := make(chan applyResult, 1)
	f.mu.Lock()
	f.pending[seq] = ch
	f.mu.Unlock()
	return ch
}

// unregister forgets proposal seq (its result, if it still comes, is dropped).
func (f *fsm) unregister(seq uint64) {
	f.mu.Lock()
	delete(f.pending, seq)
	f.mu.Unlock()
}

// advancedAfter returns nil when the applied index is at least index, otherwise a channel that is
// closed when the applied index next moves.
func (f *fsm) advancedAfter(index uint64) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.applied.Load() >= index {
		return nil
	}
	if f.advanced == nil {
		f.advanced = make(chan struct{})
	}
	return f.advanced
}

// Snapshot implements raft.FSM. It runs on raft's FSM goroutine, so the applied index belongs to
// exactly the state the state machine returns; it is also the index raft records in the snapshot's
// metadata, since raft counts only the entries it hands to Apply.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	data, err := f.sm.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("state machine snapshot: %w", err)
	}
	return &fsmSnapshot{index: f.applied.Load(), data: data}, nil
}

// Restore implements raft.FSM: it reads the header, restores the state machine and sets the applied
// index to the snapshot's.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("read snapshot: %w", err)
	}
	if len(b) < snapHeaderLen || [4]byte(b[:4]) != snapMagic {
		return errors.New("restore snapshot: not a quorum snapshot (bad header)")
	}
	index := binary.BigEndian.Uint64(b[4:snapHeaderLen])
	if err := f.sm.Restore(index, b[snapHeaderLen:]); err != nil {
		return fmt.Errorf("state machine restore at index %d: %w", index, err)
	}
	f.restores.Add(1)
	f.mu.Lock()
	f.applied.Store(index)
	if f.advanced != nil {
		close(f.advanced)
		f.advanced = nil
	}
	f.mu.Unlock()
	return nil
}

// fsmSnapshot writes a snapshot's header and bytes.
type fsmSnapshot struct {
	index uint64
	data  []byte
}

// Persist implements raft.FSMSnapshot.
func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	var hdr [snapHeaderLen]byte
	copy(hdr[:], snapMagic[:])
	binary.BigEndian.PutUint64(hdr[4:], s.index)
	if _, err := sink.Write(hdr[:]); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("write snapshot header: %w", err)
	}
	if _, err := sink.Write(s.data); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("write snapshot: %w", err)
	}
	if err := sink.Close(); err != nil {
		return fmt.Errorf("close snapshot: %w", err)
	}
	return nil
}

// Release implements raft.FSMSnapshot.
func (s *fsmSnapshot) Release() {}
