package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"
)

// redisServer is a redis-server started by the harness, with the append-only file on.
type redisServer struct {
	proc *process
	addr string
}

// startRedis starts redis-server on a free port of 127.0.0.1 with its AOF in dir and appendfsync set
// to fsync ("always": fsync before answering, once per event-loop pass, so a pipeline shares one;
// "everysec": written to the OS before answering, fsynced by a background thread every second). RDB
// snapshots are off so they do not interfere.
func startRedis(bin, dir, fsync string) (*redisServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--appendonly", "yes", "--appendfsync", fsync, "--save", "", "--daemonize", "no",
		"--logfile", filepath.Join(dir, "redis-server.log"), "--protected-mode", "yes"}
	p, err := startProcess("redis-server", dir, bin, args, nil)
	if err != nil {
		return nil, err
	}
	s := &redisServer{proc: p, addr: fmt.Sprintf("127.0.0.1:%d", port)}
	c := redis.NewClient(&redis.Options{Addr: s.addr})
	defer c.Close()
	if err := waitFor(p, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return c.Ping(ctx).Err()
	}); err != nil {
		p.stop()
		return nil, err
	}
	return s, nil
}

func (s *redisServer) stop() { s.proc.stop() }

// redisDriver drives Redis Streams with go-redis: a partition is a stream of its own
// ("<topic>:<partition>"), each record an XADD with the fields k (the key, when there is one) and v.
type redisDriver struct {
	addr     string
	pipeline int
	c        *redis.Client
}

func newRedisDriver(addr string, pipeline int) *redisDriver {
	return &redisDriver{addr: addr, pipeline: pipeline, c: redis.NewClient(&redis.Options{Addr: addr})}
}

func (d *redisDriver) Close() error { return d.c.Close() }

func redisStream(topic string, p int) string { return topic + ":" + strconv.Itoa(p) }

// CreateTopic does nothing: XADD creates a stream on first use.
func (d *redisDriver) CreateTopic(ctx context.Context, topic string, partitions int) error {
	return d.c.Ping(ctx).Err()
}

type redisItem struct {
	stream   string
	key      []byte
	value    []byte
	intended time.Time
}

// redisProducer pipelines XADDs on one connection: a sender goroutine takes whatever records are
// waiting (up to the pipeline size), sends them in one round trip and waits for the answers, so one
// pipeline is in flight per producer and each stream's records stay in order.
type redisProducer struct {
	c        *redis.Client
	streams  []string
	sticky   *sticky
	ack      AckFunc
	max      int
	queue    chan redisItem
	sent     atomic.Int64
	done     atomic.Int64
	stopped  chan struct{}
	stopOnce sync.Once
}

var redisProducerSeq atomic.Int64

func (d *redisDriver) NewProducer(_ context.Context, topic string, partitions int, ack AckFunc) (Producer, error) {
	p := &redisProducer{
		c:       redis.NewClient(&redis.Options{Addr: d.addr, PoolSize: 1}),
		sticky:  newSticky(partitions, int(redisProducerSeq.Add(1))),
		ack:     ack,
		max:     d.pipeline,
		queue:   make(chan redisItem, 4*d.pipeline),
		stopped: make(chan struct{}),
	}
	for i := 0; i < partitions; i++ {
		p.streams = append(p.streams, redisStream(topic, i))
	}
	go p.sender()
	return p, nil
}

func (p *redisProducer) sender() {
	defer close(p.stopped)
	ctx := context.Background()
	items := make([]redisItem, 0, p.max)
	cmds := make([]*redis.StringCmd, 0, p.max)
	for first := range p.queue {
		items = append(items[:0], first)
	fill:
		for len(items) < p.max {
			select {
			case it, ok := <-p.queue:
				if !ok {
					break fill
				}
				items = append(items, it)
			default:
				break fill
			}
		}
		pipe := p.c.Pipeline()
		cmds = cmds[:0]
		for _, it := range items {
			var vals []any
			if it.key != nil {
				vals = []any{"k", it.key, "v", it.value}
			} else {
				vals = []any{"v", it.value}
			}
			cmds = append(cmds, pipe.XAdd(ctx, &redis.XAddArgs{Stream: it.stream, ID: "*", Values: vals}))
		}
		_, _ = pipe.Exec(ctx) // per-command errors are read below
		for i, it := range items {
			p.ack(it.intended, len(it.key)+len(it.value), cmds[i].Err())
		}
		p.done.Add(int64(len(items)))
	}
}

func (p *redisProducer) Send(ctx context.Context, partition int32, key, value []byte, intended time.Time) {
	part := p.sticky.next(partition)
	p.sent.Add(1)
	select {
	case p.queue <- redisItem{stream: p.streams[part], key: key, value: value, intended: intended}:
	case <-ctx.Done():
		p.ack(intended, len(key)+len(value), ctx.Err())
		p.done.Add(1)
	}
}

func (p *redisProducer) Flush(ctx context.Context) error {
	for p.done.Load() < p.sent.Load() {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

func (p *redisProducer) Close() error {
	p.stopOnce.Do(func() { close(p.queue) })
	<-p.stopped
	return p.c.Close()
}

// redisConsumer reads every stream of the topic with XREAD on one connection, COUNT records per
// stream per call, blocking 100 ms when there is nothing new.
type redisConsumer struct {
	c       *redis.Client
	streams []string
	ids     []string
}

const redisReadCount = 5000

func (d *redisDriver) NewConsumer(_ context.Context, topic string, partitions int) (Consumer, error) {
	c := &redisConsumer{c: redis.NewClient(&redis.Options{Addr: d.addr, PoolSize: 1})}
	for p := 0; p < partitions; p++ {
		c.streams = append(c.streams, redisStream(topic, p))
		c.ids = append(c.ids, "0-0")
	}
	return c, nil
}

func (c *redisConsumer) Run(ctx context.Context, fn RecordFunc) error {
	index := make(map[string]int, len(c.streams))
	for i, s := range c.streams {
		index[s] = i
	}
	args := make([]string, 2*len(c.streams))
	for ctx.Err() == nil {
		copy(args, c.streams)
		copy(args[len(c.streams):], c.ids)
		res, err := c.c.XRead(ctx, &redis.XReadArgs{Streams: args, Count: redisReadCount, Block: 100 * time.Millisecond}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, st := range res {
			i := index[st.Stream]
			for _, m := range st.Messages {
				var key, value []byte
				if k, ok := m.Values["k"].(string); ok {
					key = bytesOf(k)
				}
				if v, ok := m.Values["v"].(string); ok {
					value = bytesOf(v)
				}
				fn(key, value)
				c.ids[i] = m.ID
			}
		}
	}
	return nil
}

func (c *redisConsumer) Close() error { return c.c.Close() }

// bytesOf views s as bytes without a copy; the harness only reads them.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
