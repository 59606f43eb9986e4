package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// readAll collects the lines openInput yields for path (or stdin when path is "").
func readAll(t *testing.T, path string, stdin string) ([]string, []int64, *input) {
	t.Helper()
	in, err := openInput(path, strings.NewReader(stdin))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var lines []string
	var nums []int64
	if err := in.lines(func(line []byte, n int64) bool {
		lines = append(lines, string(line))
		nums = append(nums, n)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return lines, nums, in
}

func TestInputFormats(t *testing.T) {
	text := "one\r\n\ntwo\nthree" // CRLF, an empty line, no final newline
	dir := t.TempDir()
	var gz, zs bytes.Buffer
	gw := gzip.NewWriter(&gz)
	gw.Write([]byte(text))
	gw.Close()
	zw, _ := zstd.NewWriter(&zs)
	zw.Write([]byte(text))
	zw.Close()
	files := map[string][]byte{"plain.ndjson": []byte(text), "c.ndjson.gz": gz.Bytes(), "c.ndjson.zst": zs.Bytes()}
	for name, data := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		lines, nums, in := readAll(t, path, "")
		if strings.Join(lines, "|") != "one|two|three" || nums[1] != 3 {
			t.Errorf("%s: lines %q numbers %v", name, lines, nums)
		}
		if f := in.fraction(); f != 1 {
			t.Errorf("%s: fraction read %v after the end", name, f)
		}
	}
	lines, _, in := readAll(t, "", "a\nb\n")
	if strings.Join(lines, "|") != "a|b" || in.fraction() != -1 || in.name != "stdin" {
		t.Errorf("stdin: %q, fraction %v", lines, in.fraction())
	}
	if _, err := openInput(filepath.Join(dir, "missing"), nil); err == nil {
		t.Error("a missing file must fail")
	}
	bad := filepath.Join(dir, "bad.gz")
	os.WriteFile(bad, []byte("not gzip"), 0o644)
	if _, err := openInput(bad, nil); err == nil {
		t.Error("a .gz that is not gzip must fail")
	}
}

func TestInputLongLineAndStop(t *testing.T) {
	in, _ := openInput("", strings.NewReader(strings.Repeat("x", maxLineBytes+1)+"\n"))
	if err := in.lines(func([]byte, int64) bool { return true }); err == nil || !strings.Contains(err.Error(), "line 1 is longer") {
		t.Fatalf("over-long line: %v", err)
	}
	in, _ = openInput("", strings.NewReader("a\nb\nc\n"))
	n := 0
	in.lines(func([]byte, int64) bool { n++; return n < 2 })
	if n != 2 {
		t.Fatalf("lines went on after fn returned false: %d calls", n)
	}
}
