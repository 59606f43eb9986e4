package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// TestCLITopicStats: after records go to one partition of three, `topic describe --stats` shows that
// partition with non-zero rates and the whole share of the topic's records/s, marked hot, and the
// others at zero; -o json carries the same numbers.
func TestCLITopicStats(t *testing.T) {
	addr := startNode(t)
	b := "--brokers=" + addr
	mustCLI(t, "", "topic", "create", "s", "-p", "3", b)
	mustCLI(t, strings.Repeat("{\"n\":1}\n", 50), "produce", "s", "-p", "1", b)
	mustCLI(t, "{\"n\":2}\n", "produce", "s", "-p", "2", b)

	var v topicView
	if err := json.Unmarshal([]byte(mustCLI(t, "", "topic", "describe", "s", "--stats", "-o", "json", b).stdout), &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Partitions) != 3 {
		t.Fatalf("partitions: %+v", v.Partitions)
	}
	for _, p := range v.Partitions {
		s := p.Stats
		if s == nil {
			t.Fatalf("partition %d without stats", p.Partition)
		}
		switch p.Partition {
		case 0:
			if s.LastMinute.RecordsPerSec != 0 || s.RecordsInTotal != 0 || s.LastFiveMinutes.RecordsShare != 0 {
				t.Errorf("partition 0 had no traffic: %+v", s)
			}
		case 1:
			if s.RecordsInTotal != 50 || s.LastMinute.RecordsPerSec <= 0 || s.LastMinute.BytesPerSec <= 0 ||
				s.LastFiveMinutes.RecordsPerSec <= 0 || s.LastMinute.RecordsShare < 0.98 || s.LastFiveMinutes.RecordsShare < 0.98 {
				t.Errorf("partition 1 got 50 of 51 records: %+v", s)
			}
		case 2:
			if s.RecordsInTotal != 1 || s.LastMinute.RecordsShare <= 0 || s.LastMinute.RecordsShare > 0.02 {
				t.Errorf("partition 2 got 1 of 51 records: %+v", s)
			}
		}
	}
	if r := mustCLI(t, "", "topic", "describe", "s", b); strings.Contains(r.stdout, "PRODUCE RATES") {
		t.Fatalf("rates without --stats: %s", r.stdout)
	}
	out := mustCLI(t, "", "topic", "describe", "s", "--stats", b).stdout
	if !strings.Contains(out, "PRODUCE RATES") || !strings.Contains(out, "SHARE 5M") {
		t.Fatalf("no rates table: %s", out)
	}
	if !regexp.MustCompile(`(?m)^1 +[\d,.]+ +\d+\.\d\d +98\.\d% .* hot$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^0 +0\.00 +0\.00 +0\.0% +0\.00 +0\.00 +0\.0% *$`).MatchString(out) {
		t.Fatalf("partition 1 should stand out as hot, partition 0 at zero:\n%s", out)
	}
}
