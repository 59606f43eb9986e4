package meta

import (
	"errors"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"github.com/runnel-io/runnel/api/rerr"
)

func openDB(t *testing.T, dir string) *badger.DB {
	t.Helper()
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil).WithMemTableSize(4 << 20).WithValueThreshold(1024))
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func TestCreateAlterDeleteSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	s, err := Open(db, 1)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Create(Spec{Name: "a", Partitions: 3, Configs: map[string]string{"retention.ms": "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Create(Spec{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Num == b.Num || a.ID == b.ID || b.Partitions != DefaultPartitions || b.ReplicationFactor != 1 {
		t.Fatalf("a=%+v b=%+v", a, b)
	}
	if _, err := s.Alter("a", map[string]string{"retention.bytes": "5"}, []string{"retention.ms"}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Delete("b"); err != nil {
		t.Fatal(err)
	}
	cluster := s.ClusterID()
	db.Close()

	db = openDB(t, dir)
	defer db.Close()
	s, err = Open(db, 1)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := s.Get("a")
	if !ok || got.Partitions != 3 || got.Config.RetentionBytes != 5 || got.Config.RetentionMs != 604800000 || got.ID != a.ID {
		t.Fatalf("after reopen a = %+v (ok=%v)", got, ok)
	}
	if _, ok := s.Get("b"); ok {
		t.Fatal("deleted topic b is back after reopen")
	}
	if s.ClusterID() != cluster {
		t.Fatalf("cluster id changed: %s -> %s", cluster, s.ClusterID())
	}
	// A topic created again after a delete gets a new storage number, so old data can never reappear.
	b2, err := s.Create(Spec{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if b2.Num <= b.Num || b2.ID == b.ID {
		t.Fatalf("recreated b reuses num/id: %d/%s vs %d/%s", b2.Num, b2.ID, b.Num, b.ID)
	}
}

func TestCreateRejects(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s, err := Open(db, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(Spec{Name: "a.b"}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		spec Spec
		want error
	}{
		{Spec{Name: "a.b"}, rerr.ErrTopicAlreadyExists},
		{Spec{Name: "a_b"}, rerr.ErrInvalidTopic}, // collides with a.b
		{Spec{Name: "bad name"}, rerr.ErrInvalidTopic},
		{Spec{Name: "x", Partitions: MaxPartitions + 1}, rerr.ErrInvalidPartitions},
		{Spec{Name: "x", ReplicationFactor: 3}, rerr.ErrInvalidReplicationFactor},
		{Spec{Name: "x", Configs: map[string]string{"nope": "1"}}, rerr.ErrInvalidConfig},
		{Spec{Name: "x", Configs: map[string]string{"min.insync.replicas": "2"}}, rerr.ErrInvalidConfig},
	}
	for _, c := range cases {
		if _, err := s.Create(c.spec); !errors.Is(err, c.want) {
			t.Errorf("Create(%+v) = %v, want %v", c.spec, err, c.want)
		}
	}
	if n := len(s.List()); n != 1 {
		t.Fatalf("%d topics after rejected creates, want 1", n)
	}
	if _, err := s.Alter("a.b", map[string]string{"retention.ms": "x"}, nil, false); !errors.Is(err, rerr.ErrInvalidConfig) {
		t.Fatalf("bad alter: %v", err)
	}
	if got, _ := s.Get("a.b"); got.Config.RetentionMs != 604800000 {
		t.Fatalf("rejected alter changed the topic: %+v", got.Config)
	}
	if _, err := s.Delete("missing"); !errors.Is(err, rerr.ErrUnknownTopicOrPartition) {
		t.Fatalf("delete missing: %v", err)
	}
}
