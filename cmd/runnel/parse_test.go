package main

import (
	"strings"
	"testing"
	"time"

	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/client/batch"
)

func TestParseFrom(t *testing.T) {
	ts := func(s string) time.Time {
		t.Helper()
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	cases := []struct {
		in   string
		want fromSpec
	}{
		{"earliest", fromSpec{kind: fromEarliest}},
		{"START", fromSpec{kind: fromEarliest}},
		{"beginning", fromSpec{kind: fromEarliest}},
		{"latest", fromSpec{kind: fromLatest}},
		{"end", fromSpec{kind: fromLatest}},
		{"0", fromSpec{kind: fromOffset, offset: 0}},
		{" 12345 ", fromSpec{kind: fromOffset, offset: 12345}},
		{"2001-01-31T14:00:00Z", fromSpec{kind: fromTime, time: ts("2001-01-31T14:00:00Z")}},
		{"2001-01-31T14:00:00.123456789+02:00", fromSpec{kind: fromTime, time: ts("2001-01-31T14:00:00.123456789+02:00")}},
		{"2001-01-31", fromSpec{kind: fromTime, time: ts("2001-01-31T00:00:00Z")}},
	}
	for _, c := range cases {
		got, err := parseFrom(c.in)
		if err != nil {
			t.Errorf("parseFrom(%q): %v", c.in, err)
			continue
		}
		if got.kind != c.want.kind || got.offset != c.want.offset || !got.time.Equal(c.want.time) {
			t.Errorf("parseFrom(%q) = %+v, want %+v", c.in, got, c.want)
		}
	}
	for _, bad := range []string{"", "-1", "-10", "yesterday", "2001-13-01", "1.5", "2001-01-31 14:00"} {
		if _, err := parseFrom(bad); err == nil {
			t.Errorf("parseFrom(%q): want an error", bad)
		}
	}
	if s := (fromSpec{kind: fromOffset, offset: 7}).String(); s != "7" {
		t.Errorf("String() = %q", s)
	}
}

func TestParseAcksAndCompression(t *testing.T) {
	for in, want := range map[string]client.Acks{"all": client.AcksAll, "-1": client.AcksAll, "1": client.AcksLeader,
		"leader": client.AcksLeader, "0": client.AcksNone, "NONE": client.AcksNone} {
		got, err := parseAcks(in)
		if err != nil || got != want {
			t.Errorf("parseAcks(%q) = %v, %v; want %v", in, got, err, want)
		}
		if _, err := parseAcks(acksName(got)); err != nil {
			t.Errorf("acksName(%v) does not parse back", got)
		}
	}
	if _, err := parseAcks("2"); err == nil {
		t.Error("parseAcks(2): want an error")
	}
	for in, want := range map[string]batch.Compression{"none": batch.CompressionNone, "gzip": batch.CompressionGzip,
		"snappy": batch.CompressionSnappy, "LZ4": batch.CompressionLZ4, "zstd": batch.CompressionZstd} {
		if got, err := parseCompression(in); err != nil || got != want {
			t.Errorf("parseCompression(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := parseCompression("brotli"); err == nil {
		t.Error("parseCompression(brotli): want an error")
	}
}

func TestParseKVs(t *testing.T) {
	m, err := parseKVs("config", []string{"retention.ms=1000", "cleanup.policy=compact,delete", "x="})
	if err != nil {
		t.Fatal(err)
	}
	if m["retention.ms"] != "1000" || m["cleanup.policy"] != "compact,delete" || m["x"] != "" || len(m) != 3 {
		t.Fatalf("got %v", m)
	}
	for _, bad := range [][]string{{"novalue"}, {"=v"}, {"a=1", "a=2"}} {
		if _, err := parseKVs("config", bad); err == nil || !strings.Contains(err.Error(), "--config") {
			t.Errorf("parseKVs(%q): want an error naming the flag, got %v", bad, err)
		}
	}
	hs, err := parseHeaders([]string{"a=1", "a=2", "b=x=y"})
	if err != nil || len(hs) != 3 || hs[1].Key != "a" || string(hs[1].Value) != "2" || string(hs[2].Value) != "x=y" {
		t.Fatalf("parseHeaders = %+v, %v", hs, err)
	}
	if _, err := parseOutput("yaml", "table", "json"); err == nil {
		t.Error("parseOutput(yaml): want an error")
	}
	if got, err := parseOutput("JSON", "table", "json"); err != nil || got != "json" {
		t.Errorf("parseOutput(JSON) = %q, %v", got, err)
	}
}

func TestBrokerList(t *testing.T) {
	a := &app{brokers: " 10.0.0.1:7070, ,10.0.0.2:7070 "}
	got, err := a.brokerList()
	if err != nil || len(got) != 2 || got[0] != "10.0.0.1:7070" || got[1] != "10.0.0.2:7070" {
		t.Fatalf("brokerList = %q, %v", got, err)
	}
	if _, err := (&app{brokers: " , "}).brokerList(); err == nil {
		t.Fatal("empty broker list: want an error")
	}
	t.Setenv("RUNNEL_BROKERS", "example:1")
	var b app
	cmd := newTopicCmd(&b)
	if f := cmd.PersistentFlags().Lookup("brokers"); f == nil || f.DefValue != "example:1" {
		t.Fatalf("--brokers default does not come from RUNNEL_BROKERS: %+v", f)
	}
}

func TestParsePageCacheWindow(t *testing.T) {
	for in, want := range map[string]int64{"256MiB": 256 << 20, "1GB": 1e9, "16777216": 16 << 20, "2 GiB": 2 << 30,
		"unlimited": -1, "Unlimited": -1} {
		if got, err := parsePageCacheWindow(in); err != nil || got != want {
			t.Errorf("parsePageCacheWindow(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "1MiB", "15MiB", "lots", "-5MiB", "99999999EiB"} {
		if got, err := parsePageCacheWindow(in); err == nil {
			t.Errorf("parsePageCacheWindow(%q) = %d; want an error", in, got)
		}
	}
}

func TestParseValueLogFileSize(t *testing.T) {
	for in, want := range map[string]int64{"1GiB": 1 << 30, "1MiB": 1 << 20, "256 MiB": 256 << 20, "2147483647": 2<<30 - 1} {
		if got, err := parseValueLogFileSize(in); err != nil || got != want {
			t.Errorf("parseValueLogFileSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "1048575", "2GiB", "4GiB", "unlimited", "-1MiB"} {
		got, err := parseValueLogFileSize(in)
		if err == nil {
			t.Errorf("parseValueLogFileSize(%q) = %d; want an error", in, got)
		} else if !strings.Contains(err.Error(), "--value-log-file-size") {
			t.Errorf("parseValueLogFileSize(%q): error %q does not name the flag", in, err)
		}
	}
}
