package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"time"

	"github.com/runnel-io/runnel/api/rerr"
	"github.com/runnel-io/runnel/client"
	"github.com/runnel-io/runnel/client/recordpool"
)

// runnelServer is a `runnel dev` node started by the harness.
type runnelServer struct {
	proc    *process
	brokers []string
	httpURL string
}

var listenRE = regexp.MustCompile(`listening grpc=(\S+) http=(\S+)`)

// startRunnel starts bin/runnel dev on free ports with its data in dir; fsync=false adds --no-fsync.
func startRunnel(bin, dir string, fsync bool) (*runnelServer, error) {
	args := []string{"dev", "--data-dir", filepath.Join(dir, "data"), "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-level", "warn"}
	if !fsync {
		args = append(args, "--no-fsync")
	}
	addrs := make(chan [2]string, 1)
	p, err := startProcess("runnel", dir, bin, args, func(line string) bool {
		if m := listenRE.FindStringSubmatch(line); m != nil {
			addrs <- [2]string{m[1], m[2]}
			return true
		}
		return false
	})
	if err != nil {
		return nil, err
	}
	s := &runnelServer{proc: p}
	var a [2]string
	select {
	case a = <-addrs:
	case <-p.done:
		return nil, p.exited()
	case <-time.After(60 * time.Second):
		p.stop()
		return nil, fmt.Errorf("runnel did not print its addresses within 60s; log tail:\n%s", p.tail())
	}
	s.brokers, s.httpURL = []string{a[0]}, "http://"+a[1]
	adm, err := client.NewAdmin(s.brokers)
	if err != nil {
		p.stop()
		return nil, err
	}
	defer adm.Close()
	if err := waitFor(p, 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := adm.ListTopics(ctx, false)
		return err
	}); err != nil {
		p.stop()
		return nil, err
	}
	return s, nil
}

func (s *runnelServer) stop() { s.proc.stop() }

// runnelDriver drives a node with the Go SDK (client/), with the SDK's defaults except acks.
type runnelDriver struct {
	brokers []string
	acks    client.Acks
	adm     *client.Admin
}

func newRunnelDriver(brokers []string, acks client.Acks) (*runnelDriver, error) {
	adm, err := client.NewAdmin(brokers)
	if err != nil {
		return nil, err
	}
	return &runnelDriver{brokers: brokers, acks: acks, adm: adm}, nil
}

func (d *runnelDriver) Close() error { return d.adm.Close() }

func (d *runnelDriver) CreateTopic(ctx context.Context, topic string, partitions int) error {
	_, err := d.adm.CreateTopic(ctx, topic, int32(partitions), -1, nil)
	if errors.Is(err, rerr.ErrTopicAlreadyExists) {
		return nil
	}
	return err
}

type runnelProducer struct {
	p     *client.Producer
	topic string
	// recs recycles the records (Send is called from one goroutine at a time, as recordpool needs):
	// a sync.Pool cost about a tenth of the client's CPU here, and a list of records given back one by
	// one, in the order their promises ran, missed the caches on every keyed record.
	recs *recordpool.Pool
}

func (d *runnelDriver) NewProducer(_ context.Context, topic string, _ int, ack AckFunc) (Producer, error) {
	p, err := client.NewProducer(d.brokers, client.WithAcks(d.acks))
	if err != nil {
		return nil, err
	}
	return &runnelProducer{p: p, topic: topic, recs: recordpool.New(func(r *client.Record, err error) {
		ack(r.Timestamp, len(r.Key)+len(r.Value), err)
	})}, nil
}

func (p *runnelProducer) Send(ctx context.Context, partition int32, key, value []byte, intended time.Time) {
	r, promise := p.recs.Next()
	// Keyed records carry the partition the harness computed with client.KeyPartition, which is what
	// the SDK's default partitioner would pick; keyless ones (-1) use the SDK's sticky partitioner.
	r.Topic, r.Partition, r.Key, r.Value, r.Timestamp = p.topic, partition, key, value, intended
	p.p.Produce(ctx, r, promise)
}

func (p *runnelProducer) Flush(ctx context.Context) error { return p.p.Flush(ctx) }
func (p *runnelProducer) Close() error                    { return p.p.Close() }

type runnelConsumer struct {
	c *client.Consumer
}

func (d *runnelDriver) NewConsumer(_ context.Context, topic string, partitions int) (Consumer, error) {
	c, err := client.NewConsumer(d.brokers)
	if err != nil {
		return nil, err
	}
	for p := 0; p < partitions; p++ {
		if err := c.Assign(topic, int32(p), client.OffsetEarliest()); err != nil {
			c.Close()
			return nil, err
		}
	}
	return &runnelConsumer{c: c}, nil
}

// Run reads with PollFunc, the SDK's recommendation for throughput when records need not outlive
// their processing (the harness's RecordFunc keeps nothing).
func (c *runnelConsumer) Run(ctx context.Context, fn RecordFunc) error {
	each := func(r *client.Record) { fn(r.Key, r.Value) }
	for ctx.Err() == nil {
		if _, err := c.c.PollFunc(ctx, each); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	return nil
}

func (c *runnelConsumer) Close() error { return c.c.Close() }
