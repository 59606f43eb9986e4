package main

import (
	"errors"
	"testing"
)

func TestJSONField(t *testing.T) {
	line := `{"date":"2001-01-01T00:01:00","delay":33,"distance":2176,"origin":"LAS","destination":"PHL"}`
	cases := []struct {
		line, field, want string
		null              bool
	}{
		{line, "origin", "LAS", false},
		{line, "date", "2001-01-01T00:01:00", false},
		{line, "delay", "33", false},
		{line, "destination", "PHL", false},
		{` { "a" : { "x": "}\"" , "y":[1,{"z":"]"}] } , "k" : "v\u00e9\n" } `, "k", "v\u00e9\n", false},
		{`{"a":{"k":"inner"},"k":"outer"}`, "k", "outer", false},
		{`{"k":{"nested":[1,2]}}`, "k", `{"nested":[1,2]}`, false},
		{`{"k":[1, "two"]}`, "k", `[1, "two"]`, false},
		{`{"k":true}`, "k", "true", false},
		{`{"k":-1.5e3 }`, "k", "-1.5e3", false},
		{`{"k":null}`, "k", "", true},
		{`{"k\u0031":"escaped name"}`, "k1", "escaped name", false},
		{`{"":"empty name"}`, "", "empty name", false},
	}
	for _, c := range cases {
		got, err := jsonField([]byte(c.line), c.field)
		if err != nil {
			t.Errorf("jsonField(%s, %q): %v", c.line, c.field, err)
			continue
		}
		if string(got) != c.want || (got == nil) != c.null {
			t.Errorf("jsonField(%s, %q) = %q (nil %t), want %q", c.line, c.field, got, got == nil, c.want)
		}
	}
}

func TestJSONFieldMissingAndBad(t *testing.T) {
	for _, line := range []string{`{}`, `{"a":1}`, `{"a":{"k":1}}`, `{"a":"k"}`, ` {"a": [ "k" ] }`} {
		if _, err := jsonField([]byte(line), "k"); !errors.Is(err, errNoField) {
			t.Errorf("jsonField(%s): want errNoField, got %v", line, err)
		}
	}
	for _, line := range []string{``, `not json`, `[1,2]`, `"k"`, `{"k"`, `{"k":`, `{"k" 1}`, `{"a":1,}`, `{"a":1 "k":2}`,
		`{"a":"unterminated`, `{"a":{"k":1}`, `{a:1}`, `{"a":1`} {
		_, err := jsonField([]byte(line), "k")
		if err == nil || errors.Is(err, errNoField) {
			t.Errorf("jsonField(%q): want a syntax error, got %v", line, err)
		}
	}
}

func FuzzJSONField(f *testing.F) {
	f.Add([]byte(`{"origin":"LAS","x":[1,{"a":"}"}]}`), "origin")
	f.Add([]byte(`{"a\"b":1}`), `a"b`)
	f.Fuzz(func(t *testing.T, line []byte, name string) {
		jsonField(line, name) // must not panic
	})
}
