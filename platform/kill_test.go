package platform_test

import (
	"bufio"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
	"github.com/runnel-io/runnel/platform"
	"github.com/runnel-io/runnel/platform/platformtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const childDirEnv = "RUNNEL_TEST_KILL_CHILD_DIR"

// TestMain lets this test binary double as a node process that the kill -9 test can SIGKILL.
func TestMain(m *testing.M) {
	if dir := os.Getenv(childDirEnv); dir != "" {
		runChildNode(dir)
		return
	}
	os.Exit(m.Run())
}

func runChildNode(dir string) {
	cfg := platformtest.Config(dir)
	cfg.HTTPAddr = ""
	n, err := platform.New(cfg, slog.New(slog.DiscardHandler))
	if err == nil {
		err = n.Start()
	}
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	fmt.Println("LISTENING", n.GRPCAddr())
	select {} // until SIGKILL
}

// TestKill9Recovery produces with acks=all to a node in a child process, SIGKILLs it mid-stream, then
// opens the same data dir and checks that every acknowledged record is there at its offset, with
// contiguous offsets and intact contents.
func TestKill9Recovery(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childDirEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "LISTENING ") {
		t.Fatalf("child node: %q %v", line, err)
	}
	addr := strings.TrimSpace(strings.TrimPrefix(line, "LISTENING "))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	admin, records := runnelv1.NewAdminClient(conn), runnelv1.NewRecordsClient(conn)
	cr, err := admin.CreateTopics(ctxT(t), &runnelv1.CreateTopicsRequest{Topics: []*runnelv1.NewTopic{{Name: "crash", Partitions: 2}}})
	if err != nil || cr.Topics[0].Error != nil {
		t.Fatalf("create: %v %v", cr, err)
	}
	// Producers keep writing while the node is killed; only acknowledged batches are promised.
	type acked struct {
		partition int32
		offset    int64
		value     string
	}
	ackedCh := make(chan acked, 1<<16)
	stop := make(chan struct{})
	done := make(chan struct{}, 2)
	for p := int32(0); p < 2; p++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				v := fmt.Sprintf("p%d-%d", p, i)
				var b batch.Builder
				b.Append(int64(i), nil, []byte(v), nil)
				resp, err := records.Produce(ctxT(t), &runnelv1.ProduceRequest{Acks: runnelv1.Acks_ACKS_ALL,
					Partitions: []*runnelv1.ProducePartition{{Topic: "crash", Partition: p, Records: b.Build(batch.CompressionNone)}}})
				if err != nil {
					return // the node is gone
				}
				if r := resp.Partitions[0]; r.Error == nil {
					ackedCh <- acked{p, r.BaseOffset, v}
				}
			}
		}()
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(ackedCh) < 300 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // polling the acknowledged count, bounded by the deadline
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed = true
	cmd.Wait()
	close(stop)
	<-done
	<-done
	close(ackedCh)
	var all []acked
	for a := range ackedCh {
		all = append(all, a)
	}
	if len(all) < 300 {
		t.Fatalf("only %d acknowledged writes before the kill", len(all))
	}

	tn := startNode(t, dir)
	got := [2][]string{tn.readAll(t, "crash", 0), tn.readAll(t, "crash", 1)}
	for _, a := range all {
		vals := got[a.partition]
		if a.offset >= int64(len(vals)) || vals[a.offset] != a.value {
			have := "nothing"
			if a.offset < int64(len(vals)) {
				have = vals[a.offset]
			}
			t.Fatalf("acknowledged %q at %d-%d lost after kill -9: found %s (partition has %d records)", a.value, a.partition, a.offset, have, len(vals))
		}
	}
	t.Logf("%d acknowledged writes all recovered; partitions hold %d and %d records", len(all), len(got[0]), len(got[1]))
}
