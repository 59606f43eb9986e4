package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// describeJSON runs `group describe -o json`.
func describeJSON(t *testing.T, b, group string) groupView {
	t.Helper()
	var v groupView
	if err := json.Unmarshal([]byte(mustCLI(t, "", "group", "describe", group, "-o", "json", b).stdout), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func committedSum(v groupView) int64 {
	var n int64
	for _, p := range v.Partitions {
		if p.Committed != nil {
			n += *p.Committed
		}
	}
	return n
}

// The group verbs and `consume --group` end to end: a member commits exactly what it printed, the
// next one resumes after it; describe shows offsets and lag; reset-offsets shows a plan, refuses while
// a member is in the group and applies with --execute; delete refuses while there are members.
func TestCLIGroups(t *testing.T) {
	addr := startNode(t)
	b := "--brokers=" + addr
	mustCLI(t, "", "topic", "create", "t", "-p", "3", b)
	var in strings.Builder
	for i := range 100 {
		fmt.Fprintf(&in, "{\"n\":%d,\"k\":\"key-%d\"}\n", i, i%7)
	}
	mustCLI(t, in.String(), "produce", "t", "--key-field", "k", b)

	// Usage errors.
	for _, args := range [][]string{
		{"consume", "t", "--group", "g", "-p", "0"},
		{"consume", "t", "--group", "g", "--from", "5"},
		{"consume", "t", "--instance-id", "i"},
		{"group", "reset-offsets", "g", "--topic", "t"},
		{"group", "reset-offsets", "g", "--topic", "t", "--to-earliest", "--to-latest"},
		{"group", "reset-offsets", "g", "--to-earliest"},
		{"group", "reset-offsets", "g", "--topic", "t:9", "--to-earliest"},
		{"group", "reset-offsets", "g", "--topic", "t", "--to-datetime", "yesterday"},
		{"group", "describe"},
	} {
		if r := runCLI(t, "", append(args, b)...); r.code != 2 {
			t.Errorf("runnel %s: exit %d, want 2 (usage); stderr %s", strings.Join(args, " "), r.code, r.stderr)
		}
	}

	// A member prints 40 records and commits exactly those; the next one prints the other 60.
	first := parseJSONLines(t, mustCLI(t, "", "consume", "t", "--group", "g", "--max-messages", "40", "-o", "json", b).stdout)
	if len(first) != 40 {
		t.Fatalf("first member printed %d records", len(first))
	}
	v := describeJSON(t, b, "g")
	if v.State != "empty" || len(v.Members) != 0 || committedSum(v) != 40 || v.TotalLag != 60 {
		t.Fatalf("after the first member: %+v (committed %d)", v, committedSum(v))
	}
	rest := parseJSONLines(t, mustCLI(t, "", "consume", "t", "--group", "g", "--end", "-o", "json", b).stdout)
	if len(rest) != 60 {
		t.Fatalf("second member printed %d records, want 60", len(rest))
	}
	seen := map[string]bool{}
	for _, r := range append(first, rest...) {
		id := fmt.Sprintf("%d@%d", r.Partition, r.Offset)
		if seen[id] {
			t.Fatalf("record %s printed twice", id)
		}
		seen[id] = true
	}
	if v = describeJSON(t, b, "g"); committedSum(v) != 100 || v.TotalLag != 0 || len(v.Partitions) != 3 {
		t.Fatalf("after the second member: %+v", v)
	}

	// List and describe as tables.
	if r := mustCLI(t, "", "group", "list", b); !strings.Contains(r.stdout, "GROUP") || !strings.Contains(r.stdout, "g ") || !strings.Contains(r.stdout, "empty") {
		t.Fatalf("group list: %s", r.stdout)
	}
	if r := mustCLI(t, "", "group", "describe", "g", b); !strings.Contains(r.stdout, "COMMITTED") || !strings.Contains(r.stdout, "LAG") || !strings.Contains(r.stdout, "(no members)") {
		t.Fatalf("group describe: %s", r.stdout)
	}
	if r := runCLI(t, "", "group", "describe", "nope", b); r.code != 1 || !strings.Contains(r.stderr, "GROUP_ID_NOT_FOUND") {
		t.Fatalf("describe of a missing group: exit %d, %s", r.code, r.stderr)
	}

	// Reset: a dry run changes nothing; --execute does.
	r := mustCLI(t, "", "group", "reset-offsets", "g", "--topic", "t", "--shift-by", "-5", b)
	if !strings.Contains(r.stdout, "TARGET") || !strings.Contains(r.stderr, "dry run") {
		t.Fatalf("dry run: %s / %s", r.stdout, r.stderr)
	}
	if committedSum(describeJSON(t, b, "g")) != 100 {
		t.Fatal("the dry run changed the offsets")
	}
	var plan resetPlanView
	if err := json.Unmarshal([]byte(mustCLI(t, "", "group", "reset-offsets", "g", "--topic", "t:0", "--topic", "t:1,2", "--to-earliest", "--execute", "-o", "json", b).stdout), &plan); err != nil {
		t.Fatal(err)
	}
	if !plan.Executed || len(plan.Plan) != 3 || plan.Plan[0].Target != 0 || plan.Plan[0].Current == nil {
		t.Fatalf("executed plan: %+v", plan)
	}
	if v = describeJSON(t, b, "g"); committedSum(v) != 0 || v.TotalLag != 100 {
		t.Fatalf("after reset to earliest: %+v", v)
	}

	// A member in the group: reset and delete are refused; the dry run warns.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var out, errb bytes.Buffer
	go func() {
		done <- run(ctx, []string{"consume", "t", "--group", "g", b}, strings.NewReader(""), &out, &errb)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v = describeJSON(t, b, "g")
		if len(v.Members) == 1 && v.TotalLag == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the member never caught up: %+v", v)
		}
		time.Sleep(50 * time.Millisecond) // polling the group's state
	}
	if m := v.Members[0]; m.MemberEpoch <= 0 || len(m.Assignment) != 3 || len(m.SubscribedTopics) != 1 || m.ClientID != "runnel-cli" {
		t.Fatalf("member: %+v", m)
	}
	if r := mustCLI(t, "", "group", "describe", "g", b); !strings.Contains(r.stdout, v.Members[0].MemberID) || !strings.Contains(r.stdout, "t:0,1,2") ||
		!strings.Contains(r.stdout, "runnel-cli") {
		t.Fatalf("describe with a member: %s", r.stdout)
	}
	if r := runCLI(t, "", "group", "reset-offsets", "g", "--topic", "t", "--to-earliest", "--execute", b); r.code != 1 || !strings.Contains(r.stderr, "NON_EMPTY_GROUP") {
		t.Fatalf("reset with a member: exit %d, %s", r.code, r.stderr)
	}
	if r := mustCLI(t, "", "group", "reset-offsets", "g", "--topic", "t", "--to-earliest", b); !strings.Contains(r.stderr, "would be refused") {
		t.Fatalf("dry run with a member: %s", r.stderr)
	}
	if r := runCLI(t, "", "group", "delete", "g", b); r.code != 1 || !strings.Contains(r.stdout+r.stderr, "NON_EMPTY_GROUP") {
		t.Fatalf("delete with a member: exit %d, %s %s", r.code, r.stdout, r.stderr)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("consume --group exit %d: %s", code, errb.String())
	}
	if strings.Count(out.String(), "\n") != 100 {
		t.Fatalf("the follower printed %d lines, want 100", strings.Count(out.String(), "\n"))
	}

	// Without members the group can be deleted.
	if r := mustCLI(t, "", "group", "delete", "g", "-o", "json", b); !strings.Contains(r.stdout, `"group": "g"`) {
		t.Fatalf("delete: %s", r.stdout)
	}
	var groups []groupSummaryView
	if err := json.Unmarshal([]byte(mustCLI(t, "", "group", "list", "-o", "json", b).stdout), &groups); err != nil {
		t.Fatal(err)
	}
	if len(groups) != 0 {
		t.Fatalf("groups after delete: %+v", groups)
	}

	// A static member (--instance-id) that leaves keeps its partitions reserved: describe shows it
	// with member epoch -2, and the group cannot be deleted meanwhile.
	if got := parseJSONLines(t, mustCLI(t, "", "consume", "t", "--group", "static", "--instance-id", "cli-1", "--end", "-o", "json", b).stdout); len(got) != 100 {
		t.Fatalf("static member printed %d records", len(got))
	}
	if v = describeJSON(t, b, "static"); len(v.Members) != 1 || v.Members[0].InstanceID != "cli-1" || v.Members[0].MemberEpoch != -2 {
		t.Fatalf("static member after it left: %+v", v.Members)
	}
	if r := runCLI(t, "", "group", "delete", "static", b); r.code != 1 || !strings.Contains(r.stdout, "NON_EMPTY_GROUP") {
		t.Fatalf("delete with a reserved static member: exit %d, %s", r.code, r.stdout)
	}

	// bench consume with a group of members reads everything.
	var res benchResult
	if err := json.Unmarshal([]byte(mustCLI(t, "", "bench", "consume", "--topic", "t", "--members", "2", "-q", "-o", "json", b).stdout), &res); err != nil {
		t.Fatal(err)
	}
	if res.Records != 100 || res.Members != 2 || !strings.HasPrefix(res.Group, "bench-") {
		t.Fatalf("bench consume --members: %+v", res)
	}
}
