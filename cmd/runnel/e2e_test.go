package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/runnel-io/runnel/platform"
)

// startNode runs a node in-process on free ports with its data in a temp dir and returns its gRPC
// address. It is closed when the test ends.
func startNode(t *testing.T) string {
	t.Helper()
	_, addr := startNodeHandle(t)
	return addr
}

// startNodeHandle is startNode that also returns the node, for a test that closes it itself: Close may
// be called again, and the close at the end reports the same error.
func startNodeHandle(t *testing.T) (*platform.Node, string) {
	t.Helper()
	cfg := platform.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.RaftAddr = "127.0.0.1:0"
	cfg.SerfAddr = ""
	n, err := platform.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("close node: %v", err)
		}
	})
	return n, n.GRPCAddr()
}

// cliResult is what one CLI invocation printed and returned.
type cliResult struct {
	stdout, stderr string
	code           int
}

// runCLI runs the runnel command line in-process with stdin and returns its output and exit status.
// It fails the test if the command takes more than a minute.
func runCLI(t *testing.T, stdin string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, args, strings.NewReader(stdin), &out, &errb)
	if ctx.Err() != nil {
		t.Fatalf("runnel %s: timed out; stderr: %s", strings.Join(args, " "), errb.String())
	}
	return cliResult{out.String(), errb.String(), code}
}

// mustCLI is runCLI that fails the test on a non-zero exit.
func mustCLI(t *testing.T, stdin string, args ...string) cliResult {
	t.Helper()
	r := runCLI(t, stdin, args...)
	if r.code != 0 {
		t.Fatalf("runnel %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// repoRoot finds the directory holding go.mod above the working directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// flightLines returns the first n lines of ../shared/data/flights-20k.ndjson (beside the repository),
// skipping the test when the data set is absent.
func flightLines(t *testing.T, n int) []string {
	t.Helper()
	path := filepath.Join(repoRoot(t), "..", "shared", "data", "flights-20k.ndjson")
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		t.Skipf("data set %s is absent", path)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() && len(lines) < n {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(lines) != n {
		t.Fatalf("%s has %d lines, want at least %d", path, len(lines), n)
	}
	return lines
}

// parseJSONLines decodes `consume -o json` output.
func parseJSONLines(t *testing.T, out string) []jsonRecord {
	t.Helper()
	var recs []jsonRecord
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r jsonRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("bad JSON line %q: %v", sc.Text(), err)
		}
		recs = append(recs, r)
	}
	return recs
}

func TestCLIEndToEnd(t *testing.T) {
	lines := flightLines(t, 2000)
	addr := startNode(t)
	b := "--brokers=" + addr
	dir := t.TempDir()
	file := filepath.Join(dir, "flights.ndjson")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	// Topics.
	r := mustCLI(t, "", "topic", "create", "flights", "-p", "4", "-c", "retention.ms=-1", b)
	if !strings.Contains(r.stdout, "flights") || !strings.Contains(r.stdout, "created") {
		t.Fatalf("create output: %s", r.stdout)
	}
	if r = runCLI(t, "", "topic", "create", "flights", b); r.code != 1 || !strings.Contains(r.stderr, "TOPIC_ALREADY_EXISTS") {
		t.Fatalf("second create: exit %d, stderr %s", r.code, r.stderr)
	}
	var list []topicSummaryView
	if err := json.Unmarshal([]byte(mustCLI(t, "", "topic", "list", "-o", "json", b).stdout), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != "flights" || list[0].Partitions != 4 {
		t.Fatalf("topic list: %+v", list)
	}

	// Produce the file keyed by origin.
	r = mustCLI(t, "", "produce", "flights", "--file", file, "--key-field", "origin", "--compression", "lz4", b)
	if !strings.Contains(r.stderr, "produced 2,000 records") {
		t.Fatalf("produce summary: %s", r.stderr)
	}
	var desc topicView
	if err := json.Unmarshal([]byte(mustCLI(t, "", "topic", "describe", "flights", "-o", "json", b).stdout), &desc); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, p := range desc.Partitions {
		total += p.HighWatermark - p.LogStartOffset
	}
	if total != 2000 || len(desc.Partitions) != 4 {
		t.Fatalf("describe: %d records over %d partitions", total, len(desc.Partitions))
	}
	if r = mustCLI(t, "", "topic", "describe", "flights", b); !strings.Contains(r.stdout, "retention.ms") || !strings.Contains(r.stdout, "2,000 offsets retained") {
		t.Fatalf("describe table: %s", r.stdout)
	}

	// Consume everything as JSON and check counts and order: offsets consecutive per partition, and
	// per key the values in file order, each key on one partition.
	recs := parseJSONLines(t, mustCLI(t, "", "consume", "flights", "-o", "json", "--max-messages", "2000", b).stdout)
	if len(recs) != 2000 {
		t.Fatalf("consumed %d records, want 2000", len(recs))
	}
	want := map[string][]string{}
	for _, l := range lines {
		k, err := jsonField([]byte(l), "origin")
		if err != nil {
			t.Fatal(err)
		}
		want[string(k)] = append(want[string(k)], l)
	}
	got := map[string][]string{}
	next := map[int32]int64{}
	keyPart := map[string]int32{}
	for _, rec := range recs {
		if rec.Topic != "flights" || rec.Key == nil || rec.Value == nil {
			t.Fatalf("record %+v", rec)
		}
		if rec.Offset != next[rec.Partition] {
			t.Fatalf("partition %d: offset %d, want %d", rec.Partition, rec.Offset, next[rec.Partition])
		}
		next[rec.Partition]++
		if p, ok := keyPart[*rec.Key]; ok && p != rec.Partition {
			t.Fatalf("key %s on partitions %d and %d", *rec.Key, p, rec.Partition)
		}
		keyPart[*rec.Key] = rec.Partition
		if _, err := time.Parse(time.RFC3339Nano, rec.Timestamp); err != nil {
			t.Fatalf("timestamp %q: %v", rec.Timestamp, err)
		}
		got[*rec.Key] = append(got[*rec.Key], *rec.Value)
	}
	if len(got) != len(want) {
		t.Fatalf("%d keys read back, %d in the file", len(got), len(want))
	}
	for k, ls := range want {
		if strings.Join(got[k], "\n") != strings.Join(ls, "\n") {
			t.Fatalf("key %s: values differ from the file's order", k)
		}
	}

	// --end reads to the high watermark and exits; raw output is the lines themselves.
	r = mustCLI(t, "", "consume", "flights", "--end", b)
	if n := strings.Count(r.stdout, "\n"); n != 2000 {
		t.Fatalf("consume --end printed %d lines", n)
	}
	// One partition, from an offset, as a table.
	r = mustCLI(t, "", "consume", "flights", "-p", "1", "--from", "5", "--end", "-o", "table", b)
	rows := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if int64(len(rows)-1) != next[1]-5 || !strings.HasPrefix(rows[0], "PARTITION") || !strings.HasPrefix(rows[1], "1 ") {
		t.Fatalf("partition 1 from offset 5 (HW %d): %d rows: %.300s", next[1], len(rows)-1, r.stdout)
	}
	if r = mustCLI(t, "", "consume", "flights", "--from", "latest", "--end", b); r.stdout != "" {
		t.Fatalf("--from latest --end printed %q", r.stdout)
	}

	// A fixed key and headers from stdin.
	mustCLI(t, "", "topic", "create", "small", b)
	mustCLI(t, "one\n\ntwo\r\n", "produce", "small", "-k", "K", "-H", "h=v", b)
	recs = parseJSONLines(t, mustCLI(t, "", "consume", "small", "-o", "json", "-n", "2", b).stdout)
	if len(recs) != 2 || *recs[0].Value != "one" || *recs[1].Value != "two" || *recs[1].Key != "K" ||
		len(recs[0].Headers) != 1 || recs[0].Headers[0].Key != "h" || *recs[0].Headers[0].Value != "v" {
		t.Fatalf("stdin records: %+v", recs)
	}

	// Alter configs: set one, then return it to the default.
	r = mustCLI(t, "", "topic", "alter", "flights", "--set", "retention.ms=86400000", "--set", "max.message.bytes=2000000", b)
	if !regexp.MustCompile(`retention\.ms\s+86400000\s+topic`).MatchString(r.stdout) {
		t.Fatalf("alter --set: %s", r.stdout)
	}
	var cfgs []configView
	r = mustCLI(t, "", "topic", "alter", "flights", "--delete", "retention.ms", "-o", "json", b)
	if err := json.Unmarshal([]byte(r.stdout), &cfgs); err != nil {
		t.Fatal(err)
	}
	for _, c := range cfgs {
		if c.Name == "retention.ms" && (!c.IsDefault || c.Value != "604800000") || c.Name == "max.message.bytes" && c.Value != "2000000" {
			t.Fatalf("after alter --delete: %+v", cfgs)
		}
	}
	if r = runCLI(t, "", "topic", "alter", "flights", "--set", "a=1", "--delete", "a", b); r.code != 2 {
		t.Fatalf("set and delete one key: exit %d", r.code)
	}
	mustCLI(t, "", "topic", "delete", "flights", "small", b)
	if r = mustCLI(t, "", "topic", "list", b); strings.Contains(r.stdout, "flights") {
		t.Fatalf("deleted topic still listed: %s", r.stdout)
	}
}

func TestCLIErrors(t *testing.T) {
	addr := startNode(t)
	b := "--brokers=" + addr
	r := runCLI(t, "x\n", "produce", "nosuch", b)
	if r.code != 1 || !strings.Contains(r.stderr, "UNKNOWN_TOPIC_OR_PARTITION") || !strings.Contains(r.stderr, "runnel topic create nosuch") {
		t.Fatalf("produce to a missing topic: exit %d, stderr %s", r.code, r.stderr)
	}
	if r = runCLI(t, "", "consume", "t", "--from", "yesterday", b); r.code != 2 || !strings.Contains(r.stderr, "--from") {
		t.Fatalf("bad --from: exit %d, stderr %s", r.code, r.stderr)
	}
	if r = runCLI(t, "", "topic", "create", "bad/name", b); r.code != 1 || !strings.Contains(r.stderr, "INVALID_TOPIC_EXCEPTION") {
		t.Fatalf("bad topic name: exit %d, stderr %s", r.code, r.stderr)
	}
	if r = runCLI(t, "", "topic", "create", "c", "-c", "retention.ms=soon", b); r.code != 1 || !strings.Contains(r.stderr, "INVALID_CONFIG") {
		t.Fatalf("bad config: exit %d, stderr %s", r.code, r.stderr)
	}
	if r = runCLI(t, "", "topic", "create", b); r.code != 2 {
		t.Fatalf("create without a name: exit %d", r.code)
	}
	// Zero partitions or copies is a usage error, as in kafka-topics.sh, not the broker's default.
	for _, bad := range [][]string{{"-p", "0"}, {"-p", "-2"}, {"-r", "0"}} {
		if r = runCLI(t, "", append([]string{"topic", "create", "zero", b}, bad...)...); r.code != 2 || !strings.Contains(r.stderr, "at least 1") {
			t.Fatalf("create %v: exit %d, stderr %s", bad, r.code, r.stderr)
		}
	}
	if r = runCLI(t, "", "topic", "describe", "zero", b); r.code != 1 {
		t.Fatalf("a refused create made topic zero: exit %d, stdout %s", r.code, r.stdout)
	}
	if r = runCLI(t, "", "topic", "list", "--brokers", "nonsense"); r.code != 2 || !strings.Contains(r.stderr, "not a host:port address") {
		t.Fatalf("--brokers without a port: exit %d, stderr %s", r.code, r.stderr)
	}
	if r = runCLI(t, "", "nosuchverb"); r.code != 2 {
		t.Fatalf("unknown verb: exit %d", r.code)
	}
	if r = runCLI(t, "", "topic", "list", "--brokers", "127.0.0.1:1", "--timeout", "300ms"); r.code != 1 ||
		!strings.Contains(r.stderr, "LEADER_NOT_AVAILABLE") || !strings.Contains(r.stderr, "hint: is a node running at 127.0.0.1:1?") {
		t.Fatalf("no node at the address: exit %d, stderr %s", r.code, r.stderr)
	}
	// A line that is not JSON is a counted failure, the others still go out.
	mustCLI(t, "", "topic", "create", "j", b)
	r = runCLI(t, "{\"k\":\"a\"}\nnot json\n{\"k\":\"b\"}\n", "produce", "j", "--key-field", "k", b)
	if r.code != 1 || !strings.Contains(r.stderr, "1 of 3 records failed") || !strings.Contains(r.stderr, "line 2") {
		t.Fatalf("bad line: exit %d, stderr %s", r.code, r.stderr)
	}
	if got := mustCLI(t, "", "consume", "j", "--end", b).stdout; got != "{\"k\":\"a\"}\n{\"k\":\"b\"}\n" {
		t.Fatalf("the good lines: %q", got)
	}
	// The same with -o json: the summary is one JSON object on stdout.
	r = runCLI(t, "{\"k\":\"c\"}\nnot json\n{\"k\":\"d\"}\n", "produce", "j", "--key-field", "k", "-o", "json", b)
	var sum struct {
		Topic      string `json:"topic"`
		Records    int64  `json:"records"`
		Bytes      int64  `json:"bytes"`
		Failed     int64  `json:"failed"`
		FirstError string `json:"first_error"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &sum); err != nil || r.code != 1 || sum.Topic != "j" || sum.Records != 2 || sum.Failed != 1 ||
		sum.Bytes != int64(len(`{"k":"c"}`)+len(`{"k":"d"}`)+2) || !strings.Contains(sum.FirstError, "line 2") {
		t.Fatalf("produce -o json: exit %d, %+v (%v), stdout %q", r.code, sum, err, r.stdout)
	}
	mustCLI(t, "", "topic", "delete", "j", b)
	if r = runCLI(t, "", "topic", "describe", "j", b); r.code != 1 || !strings.Contains(r.stderr, "UNKNOWN_TOPIC_OR_PARTITION") {
		t.Fatalf("describe a deleted topic: exit %d, stderr %s", r.code, r.stderr)
	}
}

func TestCLIDemoAndBench(t *testing.T) {
	lines := flightLines(t, 2000)
	addr := startNode(t)
	b := "--brokers=" + addr
	file := filepath.Join(t.TempDir(), "flights.ndjson.zst")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	zw, _ := zstd.NewWriter(f)
	io.WriteString(zw, strings.Join(lines, "\n")+"\n")
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()

	r := mustCLI(t, "", "demo", "flights", "--file", file, "--partitions", "3", "-q", b)
	if !strings.Contains(r.stdout, "OK: 2,000 records sent and received") {
		t.Fatalf("demo: %s", r.stdout)
	}
	// A second run on the same topic reads only its own records.
	var rep demoReport
	r = mustCLI(t, "", "demo", "flights", "--file", file, "-q", "-o", "json", b)
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Sent != 2000 || rep.Received != 2000 || rep.Partitions != 3 || len(rep.TopKeys) != 10 {
		t.Fatalf("second demo: %+v", rep)
	}

	var res benchResult
	r = mustCLI(t, "", "bench", "produce", "--topic", "b", "--count", "3000", "--keys", "--producers", "2", "-o", "json", "-q", b)
	if strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("bench -o json must print one line: %q", r.stdout)
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatal(err)
	}
	if res.Records != 3000 || res.Errors != 0 || res.Bytes != 3000*(100+11) || res.LatP50Ms <= 0 || res.Partitions != 4 {
		t.Fatalf("bench produce: %+v", res)
	}
	// Latency is sampled from one acknowledgement in latencyEvery, the first always: a run of 3
	// records has its one sample.
	if res.LatencySamples != 3000/latencyEvery {
		t.Fatalf("bench produce of 3,000 records: %d latency samples, want %d", res.LatencySamples, 3000/latencyEvery)
	}
	r = mustCLI(t, "", "bench", "produce", "--topic", "sampled", "--count", "3", "-o", "json", "-q", b)
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatal(err)
	}
	if res.Records != 3 || res.LatencySamples != 1 || res.LatP50Ms <= 0 {
		t.Fatalf("bench produce --count 3: %+v", res)
	}
	// Paced at 20 records/s for 300 ms: records are due at 0, 50, ..., 300 ms, one clock read each, and
	// the run ends at its duration. Stamped 16 at a time, they went out in bursts of 16 and the run
	// checked its deadline every 64 records: 64 records in 3.2 s.
	r = mustCLI(t, "", "bench", "produce", "--topic", "paced", "--duration", "300ms", "--rate", "20", "-o", "json", "-q", b)
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatal(err)
	}
	if res.Records < 1 || res.Records > 7 || res.Errors != 0 {
		t.Fatalf("bench produce --duration 300ms --rate 20: %d records (want 1-7, as scheduled), %+v", res.Records, res)
	}
	r = mustCLI(t, "", "bench", "consume", "--topic", "b", "-o", "json", "-q", b)
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatal(err)
	}
	if res.Records != 3000 || res.Mode != "consume" {
		t.Fatalf("bench consume: %+v", res)
	}
	if r = mustCLI(t, "", "bench", "produce", "--topic", "b", "--duration", "200ms", "--acks", "1", "-q", b); !strings.Contains(r.stdout, "records/s") {
		t.Fatalf("bench table: %s", r.stdout)
	}
	// Values longer than the 4 MiB of random letters bench takes them from: every record is refused
	// (larger than the batch size), and each is counted once among the producers' shares of --count.
	// Before bench wrapped around within the letters, such a run panicked with a slice out of range.
	r = runCLI(t, "", "bench", "produce", "--topic", "big", "--count", "21", "--producers", "2", "--size", "5000000", "-o", "json", "-q", b)
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("bench produce of 5 MB values: exit %d, %v: %s%s", r.code, err, r.stdout, r.stderr)
	}
	if r.code != 1 || res.Records != 0 || res.Errors != 21 || !strings.Contains(r.stderr, "21 of 21 records failed") {
		t.Fatalf("bench produce of 5 MB values: exit %d, %+v, %s", r.code, res, r.stderr)
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

func TestDevCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dev")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"dev", "--data-dir", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
			"--raft-addr", "127.0.0.1:0", "--serf-addr", "127.0.0.1:0", "--no-fsync", "--log-format", "json", "--log-level", "warn",
			"--value-log-file-size", "3MiB"}, strings.NewReader(""), &out, &errb)
	}()
	addrRe := regexp.MustCompile(`listening grpc=(\S+) http=(\S+) raft=(\S+) serf=(\S+) data=(\S+) fsync=false`)
	var m []string
	waitFor(t, 30*time.Second, "runnel dev to listen", func() bool {
		select {
		case code := <-done:
			t.Fatalf("runnel dev exited with %d: %s%s", code, out.String(), errb.String())
		default:
		}
		m = addrRe.FindStringSubmatch(out.String())
		return m != nil
	})
	if m[5] != dir {
		t.Fatalf("data dir %q, want %q", m[5], dir)
	}
	mustCLI(t, "", "topic", "create", "hello", "--brokers", m[1])
	if r := mustCLI(t, "", "topic", "list", "--brokers", m[1]); !strings.Contains(r.stdout, "hello") {
		t.Fatalf("topic list: %s", r.stdout)
	}
	// Badger maps the active value-log file at twice --value-log-file-size (the default would be 2 GiB).
	vlogs, err := filepath.Glob(filepath.Join(dir, "*.vlog"))
	if err != nil || len(vlogs) == 0 {
		t.Fatalf("no value-log file in %s: %v", dir, err)
	}
	if fi, err := os.Stat(vlogs[len(vlogs)-1]); err != nil || fi.Size() != 6<<20 {
		t.Fatalf("active value-log file %s: %v, %v; want %d bytes", vlogs[len(vlogs)-1], fi, err, 6<<20)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 || !strings.Contains(out.String(), "stopped") {
			t.Fatalf("runnel dev: exit %d: %s%s", code, out.String(), errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("runnel dev did not stop within 30s of the signal")
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("data dir: %v", err)
	}
	if r := runCLI(t, "", "dev", "--log-format", "xml"); r.code != 2 {
		t.Fatalf("bad --log-format: exit %d", r.code)
	}
}
