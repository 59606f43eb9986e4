package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsServer is a nats-server with JetStream started by the harness.
type natsServer struct {
	proc *process
	url  string
}

// startNATS starts nats-server with JetStream on a free port of 127.0.0.1, file storage in dir.
//
// Durability: nats-server 2.9 has no per-write fsync. Its file store writes each message to the block
// file (the OS page cache) before the publish is acknowledged and fsyncs on a fixed interval (2 minutes)
// and when a block fills; the sync_interval option ("always" to fsync every write) arrived in 2.10.
// The config below would be refused by 2.9 if it named sync_interval, so it does not.
func startNATS(bin, dir string) (*natsServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	store := filepath.Join(dir, "jetstream")
	conf := fmt.Sprintf(`listen: 127.0.0.1:%d
max_payload: 8MB
max_pending: 256MB
jetstream {
  store_dir: %q
  max_memory_store: 1GB
  max_file_store: 200GB
}
`, port, store)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	confPath := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	p, err := startProcess("nats-server", dir, bin, []string{"-c", confPath}, nil)
	if err != nil {
		return nil, err
	}
	s := &natsServer{proc: p, url: fmt.Sprintf("nats://127.0.0.1:%d", port)}
	if err := waitFor(p, 30*time.Second, func() error {
		nc, err := nats.Connect(s.url, nats.Timeout(time.Second))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err
	}); err != nil {
		p.stop()
		return nil, err
	}
	return s, nil
}

func (s *natsServer) stop() { s.proc.stop() }

// jsDriver drives JetStream with nats.go's jetstream package. A partition is a stream of its own
// (file storage, one replica), with the subjects <topic>.<partition>.<key>; keyless records use the
// key token "_". Streams are independent logs, as partitions are, and the server works on them in
// parallel.
type jsDriver struct {
	url        string
	maxPending int
	nc         *nats.Conn
	js         jetstream.JetStream
}

func newJSDriver(url string, maxPending int) (*jsDriver, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &jsDriver{url: url, maxPending: maxPending, nc: nc, js: js}, nil
}

func (d *jsDriver) Close() error { d.nc.Close(); return nil }

func jsStream(topic string, p int) string { return topic + "_" + strconv.Itoa(p) }

func jsSubjectPrefix(topic string, p int) string { return topic + "." + strconv.Itoa(p) + "." }

func (d *jsDriver) CreateTopic(ctx context.Context, topic string, partitions int) error {
	for p := 0; p < partitions; p++ {
		_, err := d.js.CreateStream(ctx, jetstream.StreamConfig{
			Name:      jsStream(topic, p),
			Subjects:  []string{jsSubjectPrefix(topic, p) + "*"},
			Storage:   jetstream.FileStorage,
			Replicas:  1,
			Retention: jetstream.LimitsPolicy,
			Discard:   jetstream.DiscardOld,
		})
		if err != nil {
			return fmt.Errorf("create stream %s: %w", jsStream(topic, p), err)
		}
	}
	return nil
}

type jsPending struct {
	f        jetstream.PubAckFuture
	intended time.Time
	n        int
}

type jsProducer struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	prefixes []string
	sticky   *sticky
	ack      AckFunc
	pending  chan jsPending
	sent     atomic.Int64
	done     atomic.Int64
	ackDone  chan struct{}
}

var jsProducerSeq atomic.Int64

func (d *jsDriver) NewProducer(_ context.Context, topic string, partitions int, ack AckFunc) (Producer, error) {
	nc, err := nats.Connect(d.url)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(d.maxPending))
	if err != nil {
		nc.Close()
		return nil, err
	}
	p := &jsProducer{nc: nc, js: js, sticky: newSticky(partitions, int(jsProducerSeq.Add(1))), ack: ack,
		pending: make(chan jsPending, d.maxPending*2), ackDone: make(chan struct{})}
	for i := 0; i < partitions; i++ {
		p.prefixes = append(p.prefixes, jsSubjectPrefix(topic, i))
	}
	go p.acks()
	return p, nil
}

// acks waits for the acknowledgements in publish order (the server answers one connection's
// publishes in order) and reports each.
func (p *jsProducer) acks() {
	defer close(p.ackDone)
	for pe := range p.pending {
		var err error
		select {
		case <-pe.f.Ok():
		case err = <-pe.f.Err():
		}
		p.ack(pe.intended, pe.n, err)
		p.done.Add(1)
	}
}

func (p *jsProducer) Send(ctx context.Context, partition int32, key, value []byte, intended time.Time) {
	part := p.sticky.next(partition)
	subj := p.prefixes[part] + "_"
	if key != nil {
		subj = p.prefixes[part] + string(key)
	}
	msg := &nats.Msg{Subject: subj, Data: value}
	p.sent.Add(1)
	for {
		f, err := p.js.PublishMsgAsync(msg)
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) && ctx.Err() == nil {
			continue // back-pressure: max pending reached, wait for acks
		}
		if err != nil {
			p.ack(intended, len(key)+len(value), err)
			p.done.Add(1)
			return
		}
		p.pending <- jsPending{f: f, intended: intended, n: len(key) + len(value)}
		return
	}
}

func (p *jsProducer) Flush(ctx context.Context) error {
	for p.done.Load() < p.sent.Load() {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

func (p *jsProducer) Close() error {
	close(p.pending)
	<-p.ackDone
	p.nc.Close()
	return nil
}

type jsConsumer struct {
	nc        *nats.Conn
	consumers []jetstream.Consumer
}

// NewConsumer reads every partition's stream with an ordered consumer (an ephemeral push of the whole
// stream without acks, nats.go's fastest way to read a stream in order), all on one connection.
func (d *jsDriver) NewConsumer(ctx context.Context, topic string, partitions int) (Consumer, error) {
	nc, err := nats.Connect(d.url)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	c := &jsConsumer{nc: nc}
	for p := 0; p < partitions; p++ {
		oc, err := js.OrderedConsumer(ctx, jsStream(topic, p), jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("ordered consumer of %s: %w", jsStream(topic, p), err)
		}
		c.consumers = append(c.consumers, oc)
	}
	return c, nil
}

func (c *jsConsumer) Run(ctx context.Context, fn RecordFunc) error {
	var ccs []jetstream.ConsumeContext
	defer func() {
		for _, cc := range ccs {
			cc.Stop()
		}
	}()
	for _, oc := range c.consumers {
		cc, err := oc.Consume(func(m jetstream.Msg) {
			subj := m.Subject()
			var key []byte
			for i := len(subj) - 1; i >= 0; i-- {
				if subj[i] == '.' {
					if k := subj[i+1:]; k != "_" {
						key = bytesOf(k)
					}
					break
				}
			}
			fn(key, m.Data())
		}, jetstream.PullMaxMessages(10000))
		if err != nil {
			return err
		}
		ccs = append(ccs, cc)
	}
	<-ctx.Done()
	return nil
}

func (c *jsConsumer) Close() error { c.nc.Close(); return nil }
