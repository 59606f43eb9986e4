package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/internal/testaddr"
)

// bin is the runnel binary TestMain builds for the multi-process tests, with buildFlags; copierBin is
// e2e/copier, the transactional consume-transform-produce process.
var (
	bin        string
	copierBin  string
	buildFlags []string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "runnel-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin, copierBin = filepath.Join(dir, "runnel"), filepath.Join(dir, "copier")
	for out, pkg := range map[string]string{bin: "../cmd/runnel", copierBin: "./copier"} {
		build := exec.Command("go", append(append([]string{"build"}, buildFlags...), "-o", out, pkg)...)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build", pkg+":", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// node is one `runnel server` process of a test cluster. Its addresses and data dir stay the same
// across restarts.
type node struct {
	id                     int32
	dir                    string
	grpc, http, raft, serf string
	logPath                string
	extraArgs              []string
	mu                     sync.Mutex
	cmd                    *exec.Cmd
	exited                 chan struct{}
	exitCode               int
}

// cluster is a set of nodes on 127.0.0.1.
type cluster struct {
	t      *testing.T
	nodes  map[int32]*node
	voters string
}

// newCluster prepares nodes 1..n, the first `voters` of them controller voters; nothing runs yet.
func newCluster(t *testing.T, n, voters int) *cluster {
	t.Helper()
	c := &cluster{t: t, nodes: map[int32]*node{}}
	var vs []string
	for i := 1; i <= n; i++ {
		nd := c.addNode(int32(i))
		if i <= voters {
			vs = append(vs, fmt.Sprintf("%d@%s", i, nd.raft))
		}
	}
	c.voters = strings.Join(vs, ",")
	t.Cleanup(c.stopAll)
	return c
}

// startCluster is newCluster with every node started and ready.
func startCluster(t *testing.T, n, voters int) *cluster {
	t.Helper()
	c := newCluster(t, n, voters)
	var ids []int32
	for id := int32(1); id <= int32(n); id++ {
		c.start(id)
		ids = append(ids, id)
	}
	c.waitReady(45*time.Second, ids...)
	return c
}

// addNode prepares node id with fresh ports and data dir.
func (c *cluster) addNode(id int32) *node {
	dir := c.t.TempDir()
	nd := &node{id: id, dir: filepath.Join(dir, "data"), grpc: testaddr.Free(c.t), http: testaddr.Free(c.t), raft: testaddr.Free(c.t),
		serf: testaddr.Free(c.t), logPath: filepath.Join(dir, "node.log")}
	c.nodes[id] = nd
	return nd
}

// joinAddrs are the serf addresses of every node but skip.
func (c *cluster) joinAddrs(skip int32) string {
	var out []string
	for id, nd := range c.nodes {
		if id != skip {
			out = append(out, nd.serf)
		}
	}
	return strings.Join(out, ",")
}

// start starts node id's process with the environment env (KEY=VALUE) added.
func (c *cluster) start(id int32, env ...string) *node {
	c.t.Helper()
	return c.startWithID(id, id, env...)
}

// startWithID starts the process of node slot `slot` (its ports and data dir) with --node-id nodeID.
func (c *cluster) startWithID(slot, nodeID int32, env ...string) *node {
	c.t.Helper()
	id := slot
	nd := c.nodes[slot]
	args := []string{"server", "--node-id", strconv.Itoa(int(nodeID)), "--data-dir", nd.dir, "--grpc-addr", nd.grpc,
		"--http-addr", nd.http, "--raft-addr", nd.raft, "--serf-addr", nd.serf, "--controller-voters", c.voters,
		"--join", c.joinAddrs(id), "--no-fsync", "--log-level", "debug"}
	args = append(args, nd.extraArgs...)
	logf, err := os.OpenFile(nd.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	fmt.Fprintf(logf, "\n==== start %s\n", strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	nd.mu.Lock()
	nd.cmd, nd.exited, nd.exitCode = cmd, make(chan struct{}), -1
	exited := nd.exited
	nd.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		nd.mu.Lock()
		nd.exitCode = code
		nd.mu.Unlock()
		close(exited)
	}()
	return nd
}

// kill sends SIGKILL to node id and waits for the process to end.
func (c *cluster) kill(id int32) {
	c.signal(id, syscall.SIGKILL)
	c.waitExit(id, 10*time.Second)
}

func (c *cluster) signal(id int32, sig syscall.Signal) {
	nd := c.nodes[id]
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd != nil && nd.cmd.Process != nil {
		nd.cmd.Process.Signal(sig)
	}
}

// waitExit waits for node id's process to end and returns its exit status.
func (c *cluster) waitExit(id int32, timeout time.Duration) int {
	c.t.Helper()
	nd := c.nodes[id]
	nd.mu.Lock()
	exited := nd.exited
	nd.mu.Unlock()
	select {
	case <-exited:
	case <-time.After(timeout):
		c.t.Fatalf("node %d still running after %v; log:\n%s", id, timeout, nd.tail(40))
	}
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.exitCode
}

func (c *cluster) running(id int32) bool {
	nd := c.nodes[id]
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.exited == nil {
		return false
	}
	select {
	case <-nd.exited:
		return false
	default:
		return true
	}
}

// stopAll ends every process (SIGTERM, then SIGKILL) and prints the logs of a failed test.
func (c *cluster) stopAll() {
	for id := range c.nodes {
		if c.running(id) {
			c.signal(id, syscall.SIGTERM)
		}
	}
	for id, nd := range c.nodes {
		if !c.running(id) {
			continue
		}
		nd.mu.Lock()
		exited := nd.exited
		nd.mu.Unlock()
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			c.signal(id, syscall.SIGKILL)
			<-exited
		}
	}
	if keep := os.Getenv("E2E_KEEP_LOGS"); keep != "" {
		for id, nd := range c.nodes {
			b, _ := os.ReadFile(nd.logPath)
			os.WriteFile(filepath.Join(keep, fmt.Sprintf("%s-node-%d.log", strings.ReplaceAll(c.t.Name(), "/", "_"), id)), b, 0o644)
		}
	}
	if c.t.Failed() {
		for id, nd := range c.nodes {
			c.t.Logf("---- node %d log (tail) ----\n%s", id, nd.tail(60))
		}
	}
}

// tail returns the last n lines of the node's log.
func (nd *node) tail(n int) string {
	b, _ := os.ReadFile(nd.logPath)
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// log returns the node's whole log.
func (nd *node) log() string {
	b, _ := os.ReadFile(nd.logPath)
	return string(b)
}

// ready reports whether node id answers /readyz with 200.
func (c *cluster) ready(id int32) bool {
	cl := http.Client{Timeout: time.Second}
	resp, err := cl.Get("http://" + c.nodes[id].http + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitReady waits until every named node is ready.
func (c *cluster) waitReady(timeout time.Duration, ids ...int32) {
	c.t.Helper()
	waitFor(c.t, timeout, fmt.Sprintf("nodes %v ready", ids), func() error {
		for _, id := range ids {
			if !c.running(id) {
				c.t.Fatalf("node %d exited; log:\n%s", id, c.nodes[id].tail(40))
			}
			if !c.ready(id) {
				return fmt.Errorf("node %d not ready", id)
			}
		}
		return nil
	})
}

// admin returns an Admin client of nodes ids (every node when none), closed at the end of the test.
func (c *cluster) admin(ids ...int32) *client.Admin {
	c.t.Helper()
	adm, err := client.NewAdmin(c.grpcAddrs(ids...), client.WithRequestTimeout(10*time.Second))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { adm.Close() })
	return adm
}

func (c *cluster) grpcAddrs(ids ...int32) []string {
	if len(ids) == 0 {
		for id := range c.nodes {
			ids = append(ids, id)
		}
	}
	var out []string
	for _, id := range ids {
		out = append(out, c.nodes[id].grpc)
	}
	return out
}

// status asks node id for the cluster status (one attempt, short timeout).
func (c *cluster) status(id int32) (*runnelv1.ClusterStatusResponse, error) {
	adm, err := client.NewAdmin([]string{c.nodes[id].grpc}, client.WithRequestTimeout(2*time.Second))
	if err != nil {
		return nil, err
	}
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return adm.ClusterStatus(ctx)
}

// metadata asks node id alone for the metadata of topics.
func (c *cluster) metadata(id int32, topics ...string) (*runnelv1.MetadataResponse, error) {
	adm, err := client.NewAdmin([]string{c.nodes[id].grpc}, client.WithRequestTimeout(2*time.Second))
	if err != nil {
		return nil, err
	}
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return adm.Metadata(ctx, topics...)
}

// waitFor polls cond every 50 ms until it returns nil, failing the test with the last error after
// timeout. It returns the time it took.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
