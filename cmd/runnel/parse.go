package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/client/batch"
)

// fromKind says where `consume --from` starts.
type fromKind int

const (
	fromEarliest fromKind = iota // the log start offset
	fromLatest                   // the high watermark: only records produced from now on
	fromOffset                   // an absolute offset, the same in every partition
	fromTime                     // the first record with a timestamp at or after a time
)

// fromSpec is a parsed --from value.
type fromSpec struct {
	kind   fromKind
	offset int64
	time   time.Time
}

// parseFrom reads a --from value: earliest (or start, oldest, beginning), latest (or end, newest), a
// non-negative offset, or a time as RFC 3339 (2001-01-31T14:00:00Z, fractions and offsets allowed) or a
// date (2001-01-31, midnight UTC).
func parseFrom(s string) (fromSpec, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "earliest", "start", "oldest", "beginning":
		return fromSpec{kind: fromEarliest}, nil
	case "latest", "end", "newest":
		return fromSpec{kind: fromLatest}, nil
	}
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 {
			return fromSpec{}, fmt.Errorf("--from %s: an offset cannot be negative", s)
		}
		return fromSpec{kind: fromOffset, offset: n}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return fromSpec{kind: fromTime, time: t}, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return fromSpec{kind: fromTime, time: t}, nil
	}
	return fromSpec{}, fmt.Errorf("--from %q: want earliest, latest, an offset, an RFC 3339 time such as 2001-01-31T14:00:00Z, or a date such as 2001-01-31", s)
}

// clientOffset turns the spec into the SDK's start position.
func (f fromSpec) clientOffset() client.Offset {
	switch f.kind {
	case fromLatest:
		return client.OffsetLatest()
	case fromOffset:
		return client.OffsetAt(f.offset)
	case fromTime:
		return client.OffsetAfterTime(f.time)
	}
	return client.OffsetEarliest()
}

// String renders the spec as the user would write it.
func (f fromSpec) String() string {
	switch f.kind {
	case fromLatest:
		return "latest"
	case fromOffset:
		return strconv.FormatInt(f.offset, 10)
	case fromTime:
		return f.time.Format(time.RFC3339Nano)
	}
	return "earliest"
}

// parseAcks reads --acks: all (or -1), 1 (or leader), 0 (or none).
func parseAcks(s string) (client.Acks, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "all", "-1":
		return client.AcksAll, nil
	case "1", "leader":
		return client.AcksLeader, nil
	case "0", "none":
		return client.AcksNone, nil
	}
	return 0, fmt.Errorf("--acks %q: want all, 1 or 0", s)
}

// acksName is the --acks spelling of a.
func acksName(a client.Acks) string {
	switch a {
	case client.AcksLeader:
		return "1"
	case client.AcksNone:
		return "0"
	}
	return "all"
}

// compressionNames maps --compression values to codecs, as Kafka's compression.type names them.
var compressionNames = map[string]batch.Compression{
	"none":   batch.CompressionNone,
	"gzip":   batch.CompressionGzip,
	"snappy": batch.CompressionSnappy,
	"lz4":    batch.CompressionLZ4,
	"zstd":   batch.CompressionZstd,
}

// parseCompression reads --compression: none, gzip, snappy, lz4 or zstd.
func parseCompression(s string) (batch.Compression, error) {
	c, ok := compressionNames[strings.ToLower(strings.TrimSpace(s))]
	if !ok {
		return 0, fmt.Errorf("--compression %q: want none, gzip, snappy, lz4 or zstd", s)
	}
	return c, nil
}

// parseKVs reads repeated key=value flags (--config, --set, --header) into a map; flag names the flag
// in error messages. A key given twice is an error.
func parseKVs(flag string, kvs []string) (map[string]string, error) {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q: want key=value", flag, kv)
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("--%s: %q given twice", flag, k)
		}
		m[k] = v
	}
	return m, nil
}

// parseHeaders reads repeated --header key=value flags into record headers, in the order given (a
// key may repeat, as Kafka headers allow).
func parseHeaders(kvs []string) ([]client.Header, error) {
	var hs []client.Header
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--header %q: want key=value", kv)
		}
		hs = append(hs, client.Header{Key: k, Value: []byte(v)})
	}
	return hs, nil
}

// parseOutput checks an -o value against the formats a command supports.
func parseOutput(s string, allowed ...string) (string, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	for _, a := range allowed {
		if s == a {
			return s, nil
		}
	}
	return "", fmt.Errorf("-o %q: want %s", s, strings.Join(allowed, " or "))
}

// minPageCacheWindow is the least --page-cache-window takes: below it the node would drop pages that
// consumers at the end of the log are about to read.
const minPageCacheWindow = 16 << 20

// parsePageCacheWindow parses --page-cache-window: a size (parseSize) of at least minPageCacheWindow
// bytes, or "unlimited" (returned as -1, which keeps everything cached).
func parsePageCacheWindow(s string) (int64, error) {
	if strings.EqualFold(s, "unlimited") {
		return -1, nil
	}
	n, err := parseSize("--page-cache-window", s, minPageCacheWindow, math.MaxInt64)
	if err != nil {
		return 0, fmt.Errorf("%w, or unlimited", err)
	}
	return n, nil
}

// parseValueLogFileSize parses --value-log-file-size: a size (parseSize) within the bounds Badger
// takes for its value-log files, [1 MiB, 2 GiB) (plog.Options.ValueLogFileSize).
func parseValueLogFileSize(s string) (int64, error) {
	return parseSize("--value-log-file-size", s, 1<<20, 2<<30)
}

// parseSize parses the value s of the size flag named flag (humanize.ParseBytes: "256MiB", "1GB",
// "268435456") and checks it lies in [lo, hi) bytes. Its errors name the flag and the accepted range,
// not humanize's internals.
func parseSize(flag, s string, lo, hi uint64) (int64, error) {
	want := fmt.Sprintf("want a size such as 256MiB, at least %s and less than %s", humanize.IBytes(lo), humanize.IBytes(hi))
	if hi == math.MaxInt64 {
		want = fmt.Sprintf("want a size such as 256MiB or 2GiB, at least %s", humanize.IBytes(lo))
	}
	n, err := humanize.ParseBytes(s)
	if err != nil || n < lo || n >= hi {
		return 0, fmt.Errorf("%s %q: %s", flag, s, want)
	}
	return int64(n), nil
}
