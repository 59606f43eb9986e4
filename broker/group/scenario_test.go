package group

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata/*.txt scenarios")

// TestScenarios runs the scripts in testdata/: each drives one Coordinator step by step with a scripted
// clock, as the broker would, and compares what it prints with the expected output. After every step the
// runner also checks the invariants (Check) and that the records emitted so far, replayed into a fresh
// coordinator, rebuild exactly the live state.
//
// A script is a list of blocks: a command line, a line "----", the expected output, and a blank line.
// Lines starting with '#' between blocks are comments. go test -run TestScenarios -rewrite rewrites the
// expected outputs (read the diff before keeping it).
//
// Commands (members are named by aliases; a joining alias becomes its member id):
//
//	config key=value...     before anything else; keys: interval reconciling session min-session
//	                        max-session rebalance max-size max-topics retention retention-check max-metadata
//	topics name=N[@id][!]... set all topics: N partitions, id (default name), ! for internal
//	leo topic/p=N...        log end offsets for commits (default 100)
//	advance DURATION        move the clock and Tick; prints members removed and groups deleted
//	hb ALIAS [options]      a heartbeat from the alias's client, which remembers its member id, epoch and
//	                        owned partitions; options: join, leave, static-leave, group=, epoch=, id=,
//	                        instance=, sub=t1,t2, regex=, assignor=, owned=t:0,1|-, session=, rebalance=,
//	                        rack=. A client revokes what an answer leaves out at once, unless made slow.
//	slow ALIAS / fast ALIAS a slow client keeps partitions to revoke until "revoke ALIAS"
//	revoke ALIAS            the slow client finishes revoking
//	drop ALIAS              the client drops all partitions (it was fenced, or crashed)
//	commit ALIAS|admin [group=] [epoch=] [meta=BYTES] topic/p@offset...
//	txn ALIAS|admin producer=ID/EPOCH [options as commit] topic/p@offset...
//	                        a transactional offset commit (TxnOffsetCommit) of that producer
//	marker commit|abort producer=ID/EPOCH
//	                        the producer's end-transaction marker reaches the partition
//	offsets [group=] [stable] [topic/p...]
//	                        committed offsets; stable asks with require_stable
//	describe [group=]       the group as the coordinator holds it
//	list                    all groups
//	delete [group=]         delete a group
//	restart [topics...]     a new coordinator loads every record emitted so far; topics given (as for
//	                        "topics") changed while it was down
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScenario(t, f) })
	}
}

type scenarioBlock struct {
	line     int
	comments []string
	cmd      string
	want     string
	got      string
}

func parseScenario(t *testing.T, path string) []*scenarioBlock {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	var blocks []*scenarioBlock
	var comments []string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch {
		case strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#"):
			comments = append(comments, l)
			continue
		}
		b := &scenarioBlock{line: i + 1, comments: comments, cmd: l}
		comments = nil
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: command without a ---- line", path, i+1)
		}
		i += 2
		var want []string
		for ; i < len(lines) && lines[i] != ""; i++ {
			want = append(want, lines[i])
		}
		b.want = strings.Join(want, "\n")
		blocks = append(blocks, b)
	}
	// Trailing blank lines are not comments worth keeping.
	for len(comments) > 0 && strings.TrimSpace(comments[len(comments)-1]) == "" {
		comments = comments[:len(comments)-1]
	}
	if len(comments) > 0 {
		blocks = append(blocks, &scenarioBlock{comments: comments})
	}
	return blocks
}

func runScenario(t *testing.T, path string) {
	blocks := parseScenario(t, path)
	r := newRunner(t)
	for _, b := range blocks {
		if b.cmd == "" {
			continue
		}
		b.got = joinLines(r.exec(b.cmd))
		if !*rewrite && b.got != b.want {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", path, b.line, b.cmd, b.got, b.want)
		}
		if msg := r.selfCheck(); msg != "" {
			t.Fatalf("%s:%d: after %q: %s", path, b.line, b.cmd, msg)
		}
	}
	if *rewrite {
		var out bytes.Buffer
		for _, b := range blocks {
			for _, c := range b.comments {
				out.WriteString(c + "\n")
			}
			if b.cmd == "" {
				continue
			}
			fmt.Fprintf(&out, "%s\n----\n", b.cmd)
			if b.got != "" {
				out.WriteString(b.got + "\n")
			}
			out.WriteString("\n")
		}
		if err := os.WriteFile(path, append(bytes.TrimRight(out.Bytes(), "\n"), '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// client is what a scripted member's client process remembers.
type client struct {
	group, memberID, instance string
	epoch                     int32
	owned, assigned           parts
	slow                      bool
}

type runner struct {
	t       *testing.T
	cfg     Config
	c       *Coordinator
	now     time.Time
	topics  map[string]TopicInfo
	leo     map[tp]int64
	clients map[string]*client
	log     []Record
	nextID  string
	started bool
}

func newRunner(t *testing.T) *runner {
	r := &runner{t: t, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), topics: map[string]TopicInfo{},
		leo: map[tp]int64{}, clients: map[string]*client{}}
	r.cfg = DefaultConfig()
	r.cfg.NewMemberID = func() string {
		id := r.nextID
		r.nextID = ""
		return id
	}
	return r
}

func (r *runner) start() {
	if r.started {
		return
	}
	r.started = true
	r.c = New(r.cfg)
	r.persist(r.c.Start(r.now, r.topics))
}

// persist plays the broker: records are appended (to r.log) and then applied.
func (r *runner) persist(recs []Record) {
	r.log = append(r.log, recs...)
	r.c.Apply(recs)
}

func (r *runner) exec(line string) string {
	f := strings.Fields(line)
	cmd, args := f[0], f[1:]
	if cmd != "config" {
		r.start()
	}
	switch cmd {
	case "config":
		return r.config(args)
	case "topics":
		r.setTopics(args)
		before := r.snapshot()
		r.persist(r.c.SetTopics(r.now, r.topics))
		return r.diff(before)
	case "leo":
		for _, a := range args {
			k, v, _ := strings.Cut(a, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			r.leo[r.parseTP(k)] = n
		}
		return ""
	case "advance":
		d, err := time.ParseDuration(args[0])
		if err != nil {
			r.t.Fatal(err)
		}
		r.now = r.now.Add(d)
		before := r.snapshot()
		r.persist(r.c.Tick(r.now))
		return r.diff(before)
	case "hb":
		return r.heartbeat(args)
	case "slow", "fast", "revoke", "drop":
		cl := r.client(args[0])
		switch cmd {
		case "slow", "fast":
			cl.slow = cmd == "slow"
		case "revoke":
			cl.owned = cl.assigned
		case "drop":
			cl.owned, cl.assigned = nil, nil
		}
		return ""
	case "commit":
		return r.commit(args, false)
	case "txn":
		return r.commit(args, true)
	case "marker":
		p := r.producer(args)
		recs, err := r.c.Marker(p, args[0] == "commit")
		if err != nil {
			return errLine(err)
		}
		r.persist(recs)
		return "ok"
	case "offsets":
		req := &runnelv1.FetchOffsetsRequest{GroupId: r.opt(args, "group", "g")}
		var asked parts
		for _, a := range args {
			switch {
			case a == "stable":
				req.RequireStable = true
			case !strings.Contains(a, "="):
				asked = asked.with(r.parseTP(a))
			}
		}
		req.Partitions = asked.proto()
		resp, err := r.c.FetchOffsets(req)
		if err != nil {
			return errLine(err)
		}
		var b strings.Builder
		for _, o := range resp.Offsets {
			if o.Error != nil {
				fmt.Fprintf(&b, "%s/%d: %s\n", o.Topic, o.Partition, o.Error.Code)
				continue
			}
			fmt.Fprintf(&b, "%s/%d@%d epoch=%d meta=%d ts=%s\n", o.Topic, o.Partition, o.Offset, o.LeaderEpoch, len(o.Metadata), r.ts(o.CommitTimestampMs))
		}
		if b.Len() == 0 {
			return "(none)"
		}
		return b.String()
	case "describe":
		return r.describe(r.opt(args, "group", "g"))
	case "list":
		var b strings.Builder
		for _, s := range r.c.List() {
			fmt.Fprintf(&b, "%s %s members=%d\n", s.GroupId, s.State, s.Members)
		}
		if b.Len() == 0 {
			return "(none)"
		}
		return b.String()
	case "delete":
		recs, err := r.c.DeleteGroup(r.now, r.opt(args, "group", "g"))
		if err != nil {
			return errLine(err)
		}
		r.persist(recs)
		return "ok"
	case "restart":
		if len(args) > 0 { // the topics changed while the coordinator was down
			r.setTopics(args)
		}
		c := New(r.cfg)
		for _, rec := range r.log {
			if err := c.Load(rec); err != nil {
				r.t.Fatalf("replay: %v", err)
			}
		}
		r.c = c
		recs := c.Start(r.now, r.topics)
		r.persist(recs)
		return fmt.Sprintf("replayed %d records; wrote %d", len(r.log)-len(recs), len(recs))
	}
	r.t.Fatalf("unknown command %q", cmd)
	return ""
}

// setTopics parses "name=N[@id][!]" arguments into r.topics.
func (r *runner) setTopics(args []string) {
	r.topics = map[string]TopicInfo{}
	for _, a := range args {
		name, spec, _ := strings.Cut(a, "=")
		internal := strings.HasSuffix(spec, "!")
		spec = strings.TrimSuffix(spec, "!")
		n, id, _ := strings.Cut(spec, "@")
		if id == "" {
			id = name
		}
		np, err := strconv.Atoi(n)
		if err != nil {
			r.t.Fatalf("topics %q: %v", a, err)
		}
		r.topics[name] = TopicInfo{ID: id, Partitions: int32(np), Internal: internal}
	}
}

func (r *runner) config(args []string) string {
	if r.started {
		r.t.Fatal("config after the coordinator started")
	}
	for _, a := range args {
		k, v, _ := strings.Cut(a, "=")
		dur := func() time.Duration {
			d, err := time.ParseDuration(v)
			if err != nil {
				r.t.Fatalf("config %s: %v", a, err)
			}
			return d
		}
		num := func() int {
			n, err := strconv.Atoi(v)
			if err != nil {
				r.t.Fatalf("config %s: %v", a, err)
			}
			return n
		}
		switch k {
		case "interval":
			r.cfg.HeartbeatInterval = dur()
		case "reconciling":
			r.cfg.ReconcilingHeartbeatInterval = dur()
		case "session":
			r.cfg.SessionTimeout = dur()
		case "min-session":
			r.cfg.MinSessionTimeout = dur()
		case "max-session":
			r.cfg.MaxSessionTimeout = dur()
		case "rebalance":
			r.cfg.RebalanceTimeout = dur()
		case "max-size":
			r.cfg.MaxGroupSize = num()
		case "max-topics":
			r.cfg.MaxSubscribedTopics = num()
		case "retention":
			r.cfg.OffsetsRetention = dur()
		case "retention-check":
			r.cfg.OffsetsRetentionCheckInterval = dur()
		case "max-metadata":
			r.cfg.MaxOffsetMetadataBytes = num()
		default:
			r.t.Fatalf("unknown config %q", k)
		}
	}
	if err := r.cfg.Validate(); err != nil {
		r.t.Fatal(err)
	}
	return ""
}

func (r *runner) opt(args []string, key, dflt string) string {
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok && k == key {
			return v
		}
	}
	return dflt
}

func (r *runner) client(alias string) *client {
	cl := r.clients[alias]
	if cl == nil {
		cl = &client{group: "g"}
		r.clients[alias] = cl
	}
	return cl
}

func (r *runner) parseTP(s string) tp {
	topic, p, ok := strings.Cut(s, "/")
	n, err := strconv.Atoi(p)
	if !ok || err != nil {
		r.t.Fatalf("partition %q: want topic/p", s)
	}
	return tp{topic, int32(n)}
}

func (r *runner) ts(ms int64) string {
	if ms < 0 {
		return "-"
	}
	return time.UnixMilli(ms).Sub(r.now).String()
}

func errLine(err error) string {
	var e *rerr.Error
	if errors.As(err, &e) {
		return "error: " + e.Code.String()
	}
	return "error: " + err.Error()
}

func (r *runner) heartbeat(args []string) string {
	alias := args[0]
	cl := r.client(alias)
	req := &runnelv1.GroupHeartbeatRequest{GroupId: cl.group, MemberId: cl.memberID, MemberEpoch: cl.epoch,
		InstanceId: cl.instance, SubscriptionUnchanged: true, OwnedPartitions: cl.owned.proto()}
	for _, a := range args[1:] {
		k, v, _ := strings.Cut(a, "=")
		dur := func() int32 {
			d, err := time.ParseDuration(v)
			if err != nil {
				r.t.Fatalf("hb %s: %v", a, err)
			}
			return int32(d / time.Millisecond)
		}
		switch k {
		case "join":
			req.MemberEpoch, req.MemberId, req.OwnedPartitions = JoinEpoch, "", nil
			req.SubscriptionUnchanged = false
			r.nextID = alias
		case "rejoin": // join again keeping the member id
			req.MemberEpoch, req.OwnedPartitions = JoinEpoch, nil
			req.SubscriptionUnchanged = false
		case "leave":
			req.MemberEpoch = LeaveEpoch
		case "static-leave":
			req.MemberEpoch = StaticLeaveEpoch
		case "group":
			req.GroupId = v
			cl.group = v
		case "epoch":
			n, _ := strconv.Atoi(v)
			req.MemberEpoch = int32(n)
		case "id":
			req.MemberId = v
		case "instance":
			req.InstanceId = v
			cl.instance = v
		case "sub":
			req.SubscribedTopicNames = strings.Split(v, ",")
			if v == "" {
				req.SubscribedTopicNames = nil
			}
			req.SubscriptionUnchanged = false
		case "regex":
			req.SubscribedTopicRegex = v
			req.SubscriptionUnchanged = false
		case "assignor":
			req.ServerAssignor = v
		case "owned":
			p, err := parsePartsString(v)
			if err != nil {
				r.t.Fatal(err)
			}
			req.OwnedPartitions = p.proto()
		case "session":
			req.SessionTimeoutMs = dur()
		case "rebalance":
			req.RebalanceTimeoutMs = dur()
		case "rack":
			req.RackId = v
		case "unchanged":
			req.SubscriptionUnchanged = true
		default:
			r.t.Fatalf("hb: unknown option %q", a)
		}
	}
	before := r.snapshot()
	resp, recs, err := r.c.Heartbeat(r.now, req, ClientInfo{ClientID: alias, ClientHost: "host-" + alias})
	r.nextID = ""
	if err != nil {
		return errLine(err) + r.diff(before)
	}
	r.persist(recs)
	cl.memberID, cl.epoch = resp.MemberId, resp.MemberEpoch
	if resp.MemberEpoch < 0 {
		cl.owned, cl.assigned, cl.epoch = nil, nil, 0
		return fmt.Sprintf("%s: left (epoch %d)%s", resp.MemberId, resp.MemberEpoch, r.diff(before))
	}
	asg := "(unchanged)"
	if resp.Assignment != nil {
		p, err := partsFromProto("assignment", resp.Assignment.Partitions, MaxOwnedPartitions)
		if err != nil {
			r.t.Fatal(err)
		}
		cl.assigned = p
		if cl.slow {
			cl.owned = cl.owned.union(p)
		} else {
			cl.owned = p
		}
		asg = p.String()
	}
	return fmt.Sprintf("%s: epoch=%d interval=%dms assignment=%s%s", resp.MemberId, resp.MemberEpoch, resp.HeartbeatIntervalMs, asg, r.diff(before))
}

// producer parses the producer=ID/EPOCH option.
func (r *runner) producer(args []string) Producer {
	v := r.opt(args, "producer", "")
	id, epoch, ok := strings.Cut(v, "/")
	n, err1 := strconv.ParseInt(id, 10, 64)
	e, err2 := strconv.ParseInt(epoch, 10, 16)
	if !ok || err1 != nil || err2 != nil {
		r.t.Fatalf("producer=%q: want producer=ID/EPOCH", v)
	}
	return Producer{ID: n, Epoch: int16(e)}
}

func (r *runner) commit(args []string, txn bool) string {
	who := args[0]
	req := &runnelv1.CommitOffsetsRequest{GroupId: "g", MemberEpoch: AdminEpoch}
	if who != "admin" {
		cl := r.client(who)
		req.GroupId, req.MemberId, req.MemberEpoch = cl.group, cl.memberID, cl.epoch
	}
	meta := 0
	for _, a := range args[1:] {
		k, v, isOpt := strings.Cut(a, "=")
		switch {
		case isOpt && k == "group":
			req.GroupId = v
		case isOpt && k == "epoch":
			n, _ := strconv.Atoi(v)
			req.MemberEpoch = int32(n)
		case isOpt && k == "meta":
			meta, _ = strconv.Atoi(v)
		case isOpt && k == "member":
			req.MemberId = v
		case isOpt && k == "producer":
		default:
			part, off, _ := strings.Cut(a, "@")
			k := r.parseTP(part)
			o, err := strconv.ParseInt(off, 10, 64)
			if err != nil {
				r.t.Fatalf("commit %q: %v", a, err)
			}
			req.Partitions = append(req.Partitions, &runnelv1.CommitPartition{Topic: k.topic, Partition: k.part, Offset: o, LeaderEpoch: -1,
				Metadata: strings.Repeat("m", meta)})
		}
	}
	logEnd := func(topic string, p int32) (int64, bool) {
		ti, ok := r.topics[topic]
		if !ok || p < 0 || p >= ti.Partitions {
			return 0, false
		}
		if n, ok := r.leo[tp{topic, p}]; ok {
			return n, true
		}
		return 100, true
	}
	var resp *runnelv1.CommitOffsetsResponse
	var recs []Record
	var err error
	if txn {
		p := r.producer(args)
		resp, recs, err = r.c.TxnOffsetCommit(r.now, &runnelv1.TxnOffsetCommitRequest{GroupId: req.GroupId, TransactionalId: fmt.Sprintf("tx%d", p.ID),
			ProducerId: p.ID, ProducerEpoch: int32(p.Epoch), MemberId: req.MemberId, MemberEpoch: req.MemberEpoch, Partitions: req.Partitions}, logEnd)
	} else {
		resp, recs, err = r.c.Commit(r.now, req, logEnd)
	}
	if err != nil {
		return errLine(err)
	}
	r.persist(recs)
	var b strings.Builder
	for _, p := range resp.Partitions {
		res := "ok"
		if p.Error != nil {
			res = p.Error.Code.String()
		}
		fmt.Fprintf(&b, "%s/%d: %s\n", p.Topic, p.Partition, res)
	}
	return b.String()
}

func (r *runner) describe(id string) string {
	d := r.c.Describe(id)
	if d.Error != nil {
		return "error: " + d.Error.Code.String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s epoch=%d assignment-epoch=%d assignor=%s\n", id, d.State, d.GroupEpoch, d.AssignmentEpoch, d.Assignor)
	g := r.c.groups[id]
	if g == nil {
		return b.String()
	}
	for _, mid := range sortedKeys(g.members) {
		m := g.members[mid]
		fmt.Fprintf(&b, "  %s", mid)
		if m.instanceID != "" {
			fmt.Fprintf(&b, " instance=%s", m.instanceID)
		}
		if m.departed {
			b.WriteString(" departed")
		}
		fmt.Fprintf(&b, " epoch=%d %v owns=%v", m.epoch, m.state, m.assigned)
		if len(m.pending) > 0 {
			fmt.Fprintf(&b, " revoking=%v", m.pending)
		}
		fmt.Fprintf(&b, " target=%v\n", g.target[mid])
	}
	return b.String()
}

// snapshot and diff report members that disappeared and groups that were deleted by a command, so
// timeouts show in the output.
type runnerSnapshot map[string][]string

func (r *runner) snapshot() runnerSnapshot {
	s := runnerSnapshot{}
	for gid, g := range r.c.groups {
		s[gid] = sortedKeys(g.members)
	}
	return s
}

func (r *runner) diff(before runnerSnapshot) string {
	var out []string
	for _, gid := range sortedKeys(before) {
		g := r.c.groups[gid]
		if g == nil {
			out = append(out, "group "+gid+" deleted")
			continue
		}
		for _, mid := range before[gid] {
			if g.members[mid] == nil {
				out = append(out, "removed "+mid)
			}
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "\n" + strings.Join(out, "\n")
}

// joinLines drops empty lines, so outputs never hold the blank line that ends a block.
func joinLines(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// selfCheck verifies the invariants and that the records emitted so far rebuild the live state.
func (r *runner) selfCheck() string {
	if r.c == nil {
		return ""
	}
	if err := r.c.Check(); err != nil {
		return err.Error()
	}
	fresh := New(r.cfg)
	for _, rec := range r.log {
		if err := fresh.Load(rec); err != nil {
			return "replay: " + err.Error()
		}
	}
	if recs := fresh.Start(r.now, r.topics); len(recs) > 0 {
		return fmt.Sprintf("a replay of the log is out of date: Start wrote %d records", len(recs))
	}
	if got, want := dumpState(fresh), dumpState(r.c); got != want {
		return fmt.Sprintf("replayed state differs from the live state:\nreplayed:\n%s\nlive:\n%s", got, want)
	}
	return ""
}

// dumpState prints everything the coordinator persists, deterministically.
func dumpState(c *Coordinator) string {
	var b strings.Builder
	for _, gid := range sortedKeys(c.groups) {
		g := c.groups[gid]
		fmt.Fprintf(&b, "group %s epoch=%d/%d assignor=%s empty-since=%d meta=%v\n", gid, g.epoch, g.assignmentEpoch, g.assignor,
			g.value().emptySinceMs, sortedSubTopics(g.subMeta))
		for _, mid := range sortedKeys(g.members) {
			fmt.Fprintf(&b, "  %s %+v\n", mid, g.memberValue(g.members[mid]))
		}
	}
	for _, gid := range sortedKeys(c.offsets) {
		keys := slices.SortedFunc(func(yield func(tp) bool) {
			for k := range c.offsets[gid] {
				if !yield(k) {
					return
				}
			}
		}, cmpTP)
		for _, k := range keys {
			fmt.Fprintf(&b, "offset %s %s/%d %+v\n", gid, k.topic, k.part, c.offsets[gid][k])
		}
	}
	pids := slices.Sorted(maps.Keys(c.txns))
	for _, pid := range pids {
		t := c.txns[pid]
		fmt.Fprintf(&b, "producer %d epoch=%d\n", pid, t.epoch)
		if t.offsets != nil {
			// The open transaction is part of the state (Marker refuses a marker at its epoch), also
			// once other commits made all its offsets moot.
			fmt.Fprintf(&b, "  open transaction at epoch=%d\n", t.offsetsEpoch)
		}
		for _, gid := range sortedKeys(t.offsets) {
			for _, k := range slices.SortedFunc(maps.Keys(t.offsets[gid]), cmpTP) {
				fmt.Fprintf(&b, "  pending %s %s/%d %+v\n", gid, k.topic, k.part, t.offsets[gid][k].commit)
			}
		}
	}
	return b.String()
}

// parsePartsString is the inverse of parts.String: "t1:0,1 t2:3" (or with + for the space), with
// ranges "t1:0..5", or "-".
func parsePartsString(s string) (parts, error) {
	var out parts
	if s == "-" || s == "" {
		return nil, nil
	}
	for _, f := range strings.Fields(strings.ReplaceAll(s, "+", " ")) {
		topic, nums, ok := strings.Cut(f, ":")
		if !ok || topic == "" {
			return nil, fmt.Errorf("partitions %q: want topic:p,p,...", f)
		}
		for _, ns := range strings.Split(nums, ",") {
			lo, hi, isRange := strings.Cut(ns, "..")
			a, err := strconv.Atoi(lo)
			if err != nil {
				return nil, fmt.Errorf("partitions %q: %w", f, err)
			}
			b := a
			if isRange {
				if b, err = strconv.Atoi(hi); err != nil {
					return nil, fmt.Errorf("partitions %q: %w", f, err)
				}
			}
			for n := a; n <= b; n++ {
				out = out.with(tp{topic, int32(n)})
			}
		}
	}
	return out, nil
}
