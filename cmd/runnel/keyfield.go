package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// errNoField reports a JSON object without the field asked for.
var errNoField = errors.New("no such top-level field")

// jsonField returns the value of the top-level field name of the JSON object in line, for
// `produce --key-field`: a string's contents (unescaped), or the JSON text of any other value (number,
// true, object, ...). A null value returns (nil, nil): a record without a key. A missing field returns
// errNoField (wrapped). The object is scanned only as far as the field, without decoding the rest, so
// this keeps up with millions of lines a second; the result may share line's memory.
func jsonField(line []byte, name string) ([]byte, error) {
	i := skipWS(line, 0)
	if i >= len(line) || line[i] != '{' {
		return nil, errors.New("line is not a JSON object")
	}
	i++
	for first := true; ; first = false {
		i = skipWS(line, i)
		if i >= len(line) {
			return nil, errors.New("unterminated JSON object")
		}
		if line[i] == '}' && first {
			return nil, fmt.Errorf("%w %q", errNoField, name)
		}
		if line[i] != '"' {
			return nil, fmt.Errorf("JSON object: want a field name at byte %d", i)
		}
		kend, err := scanString(line, i)
		if err != nil {
			return nil, err
		}
		match := stringEquals(line[i:kend], name)
		i = skipWS(line, kend)
		if i >= len(line) || line[i] != ':' {
			return nil, fmt.Errorf("JSON object: want ':' at byte %d", i)
		}
		i = skipWS(line, i+1)
		vend, err := skipValue(line, i)
		if err != nil {
			return nil, err
		}
		if match {
			return fieldValue(line[i:vend])
		}
		i = skipWS(line, vend)
		if i >= len(line) {
			return nil, errors.New("unterminated JSON object")
		}
		switch line[i] {
		case ',':
			i++
		case '}':
			return nil, fmt.Errorf("%w %q", errNoField, name)
		default:
			return nil, fmt.Errorf("JSON object: want ',' or '}' at byte %d", i)
		}
	}
}

// fieldValue turns the JSON text of a value into key bytes.
func fieldValue(v []byte) ([]byte, error) {
	switch v[0] {
	case '"':
		if bytes.IndexByte(v, '\\') < 0 {
			return v[1 : len(v)-1], nil
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return nil, fmt.Errorf("JSON string: %w", err)
		}
		return []byte(s), nil
	case 'n':
		if string(v) == "null" {
			return nil, nil
		}
	}
	return v, nil
}

// stringEquals reports whether the JSON string token tok (quotes included) spells name.
func stringEquals(tok []byte, name string) bool {
	inner := tok[1 : len(tok)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return string(inner) == name
	}
	var s string
	return json.Unmarshal(tok, &s) == nil && s == name
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// scanString returns the index after the JSON string that starts with the quote at b[i].
func scanString(b []byte, i int) (int, error) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated JSON string at byte %d", i)
}

// skipValue returns the index after the JSON value that starts at b[i]. Objects and arrays are
// skipped by bracket depth (strings inside them respected); scalars run to the next delimiter.
func skipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, errors.New("JSON object: missing value")
	}
	switch b[i] {
	case '"':
		return scanString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end, err := scanString(b, j)
				if err != nil {
					return 0, err
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, fmt.Errorf("unterminated JSON value at byte %d", i)
	case ',', '}', ']', ':':
		return 0, fmt.Errorf("JSON object: missing value at byte %d", i)
	}
	j := i
	for ; j < len(b); j++ {
		switch b[j] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return j, nil
		}
	}
	return j, nil
}
