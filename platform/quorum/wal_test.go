package quorum

import (
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
)

// TestRaftLogTailTruncationSurvivesRestart: raft clears its log's suffix (DeleteRange of the tail)
// when a vote tells it a newer leader does not have those entries; a controller that stops right
// after must open its raft log again. raft-wal before v0.4.1 marked the tail segment sealed without
// writing its index block, and the next start panicked in raft.NewRaft with "sealed segment has no
// index block" (hashicorp/raft-wal#31): found by the e2e transactional copier's kill -9 of a node.
func TestRaftLogTailTruncationSurvivesRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	open := func() (*raftwal.WAL, *metadb.BoltMetaDB) {
		t.Helper()
		meta := &metadb.BoltMetaDB{}
		w, err := raftwal.Open(dir, raftwal.WithMetaStore(meta), raftwal.WithSegmentSize(64<<10))
		if err != nil {
			t.Fatalf("open the raft log in %s: %v", filepath.Base(dir), err)
		}
		return w, meta
	}
	w, meta := open()
	var logs []*raft.Log
	for i := uint64(1); i <= 10; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: []byte("entry")})
	}
	if err := w.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	if err := w.DeleteRange(9, 10); err != nil {
		t.Fatalf("truncate the tail: %v", err)
	}
	if err := w.StoreLogs([]*raft.Log{{Index: 9, Term: 2, Type: raft.LogCommand, Data: []byte("new leader")}}); err != nil {
		t.Fatalf("append after the truncation: %v", err)
	}
	_ = w.Close()
	_ = meta.Close()

	w, meta = open()
	defer func() { _ = w.Close(); _ = meta.Close() }()
	last, err := w.LastIndex()
	if err != nil || last != 9 {
		t.Fatalf("last index after the restart: %d %v, want 9", last, err)
	}
	for i := uint64(1); i <= 9; i++ {
		var l raft.Log
		if err := w.GetLog(i, &l); err != nil {
			t.Fatalf("entry %d after the restart: %v", i, err)
		}
		if want := uint64(1) + i/9; l.Term != want {
			t.Fatalf("entry %d has term %d, want %d", i, l.Term, want)
		}
	}
}
