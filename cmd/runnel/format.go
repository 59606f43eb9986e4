package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dustin/go-humanize"
	"github.com/runnel-io/runnel/client"
)

// Record output formats of `consume -o`.
const (
	formatRaw   = "raw"   // the value, one line per record (what `produce` reads back in)
	formatJSON  = "json"  // one JSON object per line
	formatTable = "table" // aligned columns: partition, offset, timestamp, key, value
)

// jsonRecord is one line of `consume -o json`. Keys, values and header values are strings when they are
// valid UTF-8; otherwise they are base64 and the matching *_encoding field says "base64". A null key or
// value (a tombstone) is JSON null.
type jsonRecord struct {
	Topic         string       `json:"topic"`
	Partition     int32        `json:"partition"`
	Offset        int64        `json:"offset"`
	Timestamp     string       `json:"timestamp"`
	Key           *string      `json:"key"`
	KeyEncoding   string       `json:"key_encoding,omitempty"`
	Value         *string      `json:"value"`
	ValueEncoding string       `json:"value_encoding,omitempty"`
	Headers       []jsonHeader `json:"headers"`
}

// jsonHeader is one record header in `consume -o json`.
type jsonHeader struct {
	Key           string  `json:"key"`
	Value         *string `json:"value"`
	ValueEncoding string  `json:"value_encoding,omitempty"`
}

// encodeBytes renders b for JSON: the text itself when valid UTF-8, else base64 with encoding "base64".
func encodeBytes(b []byte) (s *string, encoding string) {
	if b == nil {
		return nil, ""
	}
	if utf8.Valid(b) {
		t := string(b)
		return &t, ""
	}
	t := base64.StdEncoding.EncodeToString(b)
	return &t, "base64"
}

// toJSONRecord converts a consumed record to its -o json form.
func toJSONRecord(r *client.Record) jsonRecord {
	j := jsonRecord{
		Topic:     r.Topic,
		Partition: r.Partition,
		Offset:    r.Offset,
		Timestamp: r.Timestamp.UTC().Format(time.RFC3339Nano),
		Headers:   make([]jsonHeader, 0, len(r.Headers)),
	}
	j.Key, j.KeyEncoding = encodeBytes(r.Key)
	j.Value, j.ValueEncoding = encodeBytes(r.Value)
	for _, h := range r.Headers {
		v, enc := encodeBytes(h.Value)
		j.Headers = append(j.Headers, jsonHeader{Key: h.Key, Value: v, ValueEncoding: enc})
	}
	return j
}

// recordWriter prints consumed records in one of the -o formats. Call flush after each batch.
type recordWriter struct {
	w           *bufio.Writer
	format      string
	enc         *json.Encoder
	wroteHeader bool
}

func newRecordWriter(w io.Writer, format string) *recordWriter {
	bw := bufio.NewWriterSize(w, 256<<10)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	return &recordWriter{w: bw, format: format, enc: enc}
}

// tableTimeFormat is RFC 3339 with milliseconds, fixed width in UTC.
const tableTimeFormat = "2006-01-02T15:04:05.000Z07:00"

func (rw *recordWriter) write(r *client.Record) error {
	switch rw.format {
	case formatJSON:
		return rw.enc.Encode(toJSONRecord(r))
	case formatTable:
		if !rw.wroteHeader {
			rw.wroteHeader = true
			fmt.Fprintf(rw.w, "%-9s  %-10s  %-24s  %-12s  %s\n", "PARTITION", "OFFSET", "TIMESTAMP", "KEY", "VALUE")
		}
		key := "-"
		if r.Key != nil {
			key = printable(r.Key)
		}
		value := "<null>"
		if r.Value != nil {
			value = printable(r.Value)
		}
		_, err := fmt.Fprintf(rw.w, "%-9d  %-10d  %-24s  %-12s  %s\n", r.Partition, r.Offset,
			r.Timestamp.UTC().Format(tableTimeFormat), key, value)
		return err
	default:
		rw.w.Write(r.Value)
		return rw.w.WriteByte('\n')
	}
}

func (rw *recordWriter) flush() error { return rw.w.Flush() }

// printable returns b as text for a table cell: itself when it is valid UTF-8 without control
// characters, else Go-quoted (so binary and newlines stay on one line).
func printable(b []byte) string {
	s := string(b)
	if utf8.ValidString(s) {
		ok := true
		for _, c := range s {
			if unicode.IsControl(c) {
				ok = false
				break
			}
		}
		if ok {
			return s
		}
	}
	return strconv.Quote(s)
}

// newTable returns a tabwriter for aligned columns; Flush it when done.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// printJSON writes v as indented JSON and a newline.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printJSONLine writes v as one line of JSON.
func printJSONLine(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// comma formats n with thousands separators.
func comma(n int64) string { return humanize.Comma(n) }

// mb formats a byte count in megabytes (10^6 bytes), as throughput figures are usually given; counts
// below a megabyte in bytes or kilobytes.
func mb(n int64) string {
	if n < 1e6 {
		return humanize.Bytes(uint64(max(n, 0)))
	}
	return fmt.Sprintf("%.1f MB", float64(n)/1e6)
}

// rate is n per second over d (0 for a zero d).
func rate(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// isTerminal reports whether w is a terminal (so progress can redraw one line).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// bytesIEC formats a byte count with binary units (KiB, MiB, ...), as sizes on disk are usually given.
func bytesIEC(n int64) string {
	if n < 0 {
		return "-"
	}
	return humanize.IBytes(uint64(n))
}

// printList writes views as JSON (an array) when out is formatJSON, else as a table: header, then one
// tab-separated row a view. The list verbs (group list, txn list, ...) share it.
func printList[V any](w io.Writer, out string, views []V, header string, row func(V) string) error {
	if out == formatJSON {
		return printJSON(w, views)
	}
	tw := newTable(w)
	fmt.Fprintln(tw, header)
	for _, v := range views {
		fmt.Fprintln(tw, row(v))
	}
	return tw.Flush()
}
