package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/runnel-io/runnel/client"
)

func testRecord() *client.Record {
	return &client.Record{
		Topic: "t", Partition: 3, Offset: 42,
		Timestamp: time.Date(2001, 1, 2, 3, 4, 5, 6000000, time.FixedZone("x", 3600)),
		Key:       []byte("ORD"), Value: []byte(`{"a":"<b>&"}`),
		Headers: []client.Header{{Key: "trace", Value: []byte("abc")}, {Key: "bin", Value: []byte{0xff, 0x00}}},
	}
}

func TestRecordJSON(t *testing.T) {
	var buf bytes.Buffer
	rw := newRecordWriter(&buf, formatJSON)
	r := testRecord()
	bin := &client.Record{Topic: "t", Partition: 0, Offset: 1, Timestamp: time.Unix(0, 0), Key: nil, Value: []byte{0xc3, 0x28}}
	for _, rec := range []*client.Record{r, bin} {
		if err := rw.write(rec); err != nil {
			t.Fatal(err)
		}
	}
	rw.flush()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got %q", buf.String())
	}
	if !strings.Contains(lines[0], `"value":"{\"a\":\"<b>&\"}"`) {
		t.Errorf("HTML characters must not be escaped: %s", lines[0])
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"topic": "t", "partition": 3.0, "offset": 42.0, "timestamp": "2001-01-02T02:04:05.006Z",
		"key": "ORD", "value": `{"a":"<b>&"}`}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %#v, want %#v", k, got[k], v)
		}
	}
	if _, ok := got["key_encoding"]; ok {
		t.Error("key_encoding set for a UTF-8 key")
	}
	hs := got["headers"].([]any)
	if len(hs) != 2 || hs[0].(map[string]any)["value"] != "abc" ||
		hs[1].(map[string]any)["value_encoding"] != "base64" || hs[1].(map[string]any)["value"] != base64.StdEncoding.EncodeToString([]byte{0xff, 0}) {
		t.Errorf("headers = %#v", hs)
	}
	var b jsonRecord
	if err := json.Unmarshal([]byte(lines[1]), &b); err != nil {
		t.Fatal(err)
	}
	if b.Key != nil || b.ValueEncoding != "base64" || *b.Value != "wyg=" || b.Headers == nil || !strings.Contains(lines[1], `"headers":[]`) {
		t.Errorf("binary record: %s", lines[1])
	}
	if !strings.Contains(lines[1], `"key":null`) {
		t.Errorf("a missing key must be null: %s", lines[1])
	}
}

func TestRecordRawAndTable(t *testing.T) {
	var buf bytes.Buffer
	rw := newRecordWriter(&buf, formatRaw)
	rw.write(testRecord())
	rw.write(&client.Record{Value: []byte("second")})
	rw.flush()
	if buf.String() != "{\"a\":\"<b>&\"}\nsecond\n" {
		t.Errorf("raw = %q", buf.String())
	}
	buf.Reset()
	rw = newRecordWriter(&buf, formatTable)
	rw.write(testRecord())
	rw.write(&client.Record{Partition: 1, Offset: 7, Timestamp: time.Unix(0, 0), Value: []byte("two\nlines")})
	rw.write(&client.Record{Partition: 1, Offset: 8, Timestamp: time.Unix(0, 0)})
	rw.flush()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "PARTITION") {
		t.Fatalf("table = %q", buf.String())
	}
	if f := strings.Fields(lines[1]); len(f) != 5 || f[0] != "3" || f[1] != "42" || f[2] != "2001-01-02T02:04:05.006Z" || f[3] != "ORD" {
		t.Errorf("row = %q", lines[1])
	}
	if !strings.HasSuffix(lines[2], `"two\nlines"`) || !strings.Contains(lines[2], " - ") {
		t.Errorf("control characters must be quoted, a missing key shown as -: %q", lines[2])
	}
	if !strings.HasSuffix(lines[3], "<null>") {
		t.Errorf("tombstone: %q", lines[3])
	}
}

func TestNumberFormats(t *testing.T) {
	if comma(3000000) != "3,000,000" || mb(276783695) != "276.8 MB" || mb(24) != "24 B" || mb(1800) != "1.8 kB" || bytesIEC(1<<20) != "1.0 MiB" || bytesIEC(-1) != "-" {
		t.Errorf("comma %s mb %s iec %s", comma(3000000), mb(276783695), bytesIEC(1<<20))
	}
	if rate(10, 2*time.Second) != 5 || rate(1, 0) != 0 {
		t.Error("rate")
	}
}

func TestSlabCopies(t *testing.T) {
	var s slab
	a := s.copy([]byte("abc"))
	b := s.copy([]byte("defg"))
	a = append(a, 'X') // must not overwrite b: the copies have capacity == length
	if string(b) != "defg" || string(a) != "abcX" || s.copy(nil) != nil {
		t.Fatalf("a %q b %q", a, b)
	}
	big := make([]byte, 100<<10)
	if c := s.copy(big); len(c) != len(big) {
		t.Fatal("big copy")
	}
}
