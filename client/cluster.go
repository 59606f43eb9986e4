package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/runnel-io/runnel/api/grpcbuf"
	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// cluster is the one place that dials brokers and the one place that decides retries. Producer,
// Consumer and Admin each own one: it keeps a gRPC connection per broker address (gRPC multiplexes all
// calls and streams to a broker over it), the brokers' addresses and the topics' partition leaders from
// the latest metadata answer.
type cluster struct {
	cfg   commonConfig
	seeds []string

	mu      sync.Mutex
	conns   map[string]*grpc.ClientConn
	brokers map[int32]string // node id → gRPC address, from metadata
	topics  map[string]*topicMeta
	next    int // round-robin over seeds and brokers for calls any broker can answer
	closed  bool
}

// topicMeta is one topic as the latest metadata answer described it.
type topicMeta struct {
	err        error // topic-level error (UNKNOWN_TOPIC_OR_PARTITION, ...)
	id         string
	partitions []partitionMeta // indexed by partition number
}

type partitionMeta struct {
	leader int32 // -1 when unknown
	epoch  int32
	err    error
}

func newCluster(brokers []string, cfg commonConfig) (*cluster, error) {
	var seeds []string
	for _, b := range brokers {
		if b != "" {
			seeds = append(seeds, b)
		}
	}
	if len(seeds) == 0 {
		return nil, errors.New("client: no broker addresses (want host:port, ...)")
	}
	return &cluster{cfg: cfg, seeds: seeds, conns: map[string]*grpc.ClientConn{}, brokers: map[int32]string{},
		topics: map[string]*topicMeta{}}, nil
}

// connectTimeout bounds one attempt to connect to a broker (TCP and the HTTP/2 handshake).
const connectTimeout = 3 * time.Second

// dial returns the connection to addr, creating it on first use. grpc.NewClient connects lazily and
// reconnects by itself, so one ClientConn per address lives as long as the cluster.
func (c *cluster) dial(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessageBytes), grpc.MaxCallSendMsgSize(maxMessageBytes)),
		grpc.WithUserAgent(c.cfg.clientID),
		// A broker that accepts connections but does not answer (paused, overloaded) fails the
		// connection attempt after connectTimeout, and the calls waiting on it with it, so the retry
		// goes to another broker instead of spending the whole request timeout on this one (gRPC's
		// default is 20 s).
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: connectTimeout}),
	}
	// Larger windows and buffers, and received frames read into uncleared buffers (api/grpcbuf).
	opts = append(opts, grpcbuf.DialOptions()...)
	opts = append(opts, c.cfg.dialOptions...)
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("client: dial %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// anyAddr picks the next broker for calls any broker answers (metadata, admin), rotating so a dead
// broker costs one retry, not all of them.
func (c *cluster) anyAddr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	addrs := c.seeds
	if len(c.brokers) > 0 {
		addrs = make([]string, 0, len(c.brokers)+len(c.seeds))
		for _, a := range c.brokers {
			addrs = append(addrs, a)
		}
		addrs = append(addrs, c.seeds...)
	}
	c.next++
	return addrs[c.next%len(addrs)]
}

// nodeAddr returns the address of broker node, or a seed when the node is unknown (no leader yet).
func (c *cluster) nodeAddr(node int32) string {
	c.mu.Lock()
	a, ok := c.brokers[node]
	c.mu.Unlock()
	if ok && a != "" {
		return a
	}
	return c.anyAddr()
}

// knows reports whether the address of broker node is known from metadata.
func (c *cluster) knows(node int32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.brokers[node]
	return ok
}

func (c *cluster) anyConn() (*grpc.ClientConn, error) { return c.dial(c.anyAddr()) }

func (c *cluster) nodeConn(node int32) (*grpc.ClientConn, error) { return c.dial(c.nodeAddr(node)) }

// close closes every connection; calls in progress fail with Canceled.
func (c *cluster) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	for _, cc := range c.conns {
		errs = append(errs, cc.Close())
	}
	return errors.Join(errs...)
}

// metadata asks any broker about topics (all when none), retrying whole-call failures, and caches the
// answer: broker addresses, and each named topic's partitions and leaders.
func (c *cluster) metadata(ctx context.Context, topics []string) (*runnelv1.MetadataResponse, error) {
	var resp *runnelv1.MetadataResponse
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.metadataOnce(ctx, topics)
		return err
	})
	return resp, err
}

// metadataOnce is one metadata call (for use inside other retry loops), caching the answer.
func (c *cluster) metadataOnce(ctx context.Context, topics []string) (*runnelv1.MetadataResponse, error) {
	cc, err := c.anyConn()
	if err != nil {
		return nil, err
	}
	resp, err := runnelv1.NewRecordsClient(cc).Metadata(ctx, &runnelv1.MetadataRequest{Topics: topics})
	if err != nil {
		return nil, wireErr(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(resp.Brokers) > 0 {
		c.brokers = make(map[int32]string, len(resp.Brokers))
		for _, b := range resp.Brokers {
			c.brokers[b.NodeId] = b.GrpcAddr
		}
	}
	for _, t := range resp.Topics {
		tm := &topicMeta{err: rerr.FromInfo(t.Error), id: t.TopicId}
		if tm.err == nil {
			n := 0
			for _, p := range t.Partitions {
				n = max(n, int(p.Partition)+1)
			}
			if n > 1<<20 {
				tm.err = rerr.New(runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, "metadata claims partition %d", n-1)
			} else {
				tm.partitions = make([]partitionMeta, n)
				for i := range tm.partitions {
					tm.partitions[i] = partitionMeta{leader: -1, epoch: -1,
						err: rerr.New(runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, "partition %d missing from metadata", i)}
				}
				for _, p := range t.Partitions {
					if p.Partition >= 0 {
						tm.partitions[p.Partition] = partitionMeta{leader: p.LeaderId, epoch: p.LeaderEpoch, err: rerr.FromInfo(p.Error)}
					}
				}
				if n == 0 {
					tm.err = rerr.New(runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, "topic %q has no partitions in metadata yet", t.Name)
				}
			}
		}
		c.topics[t.Name] = tm
	}
	return resp, nil
}

// topic returns the cached metadata of a topic (nil if never fetched).
func (c *cluster) topic(name string) *topicMeta {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.topics[name]
}

// leader returns the cached leader of a partition, or -1.
func (c *cluster) leader(topic string, partition int32) int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := c.topics[topic]; t != nil && partition >= 0 && int(partition) < len(t.partitions) {
		return t.partitions[partition].leader
	}
	return -1
}

// leaderEpoch returns the cached leader epoch of a partition, or -1: consumers send it with their
// fetches (KIP-320), so a broker that lost the leadership without knowing yet answers
// FENCED_LEADER_EPOCH instead of serving from its stale log.
func (c *cluster) leaderEpoch(topic string, partition int32) int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := c.topics[topic]; t != nil && partition >= 0 && int(partition) < len(t.partitions) && t.partitions[partition].leader >= 0 {
		return t.partitions[partition].epoch
	}
	return -1
}

// Retry policy: the one place that decides what is retried and how long to wait.

// wireErr turns an error from a gRPC call into a catalogue error (*rerr.Error) carrying the broker's
// ErrorInfo, or mapped from the transport's status code (a refused connection is LEADER_NOT_AVAILABLE,
// which is retriable). Context errors stay context errors.
func wireErr(err error) error {
	if err == nil {
		return nil
	}
	return rerr.FromStatus(err)
}

// retriable reports whether err may go away if the same call is made again later: a catalogue error
// marked retriable (rerr.Retriable). Context errors and everything else are final.
func retriable(err error) bool {
	var f final
	if errors.As(err, &f) {
		return false
	}
	var e *rerr.Error
	return errors.As(err, &e) && e.Retriable()
}

// final marks an error a retry loop must not retry even if its code is retriable (an admin call's
// per-topic answer, say, which is the answer rather than a transient failure). unfinal removes the mark.
type final struct{ error }

func (f final) Unwrap() error { return f.error }

func unfinal(err error) error {
	if f, ok := err.(final); ok {
		return f.error
	}
	return err
}

// backoff returns the wait before retry number attempt (0 for the first retry): exponential from the
// configured minimum up to the maximum, with ±20% jitter.
func (c *cluster) backoff(attempt int) time.Duration {
	d := c.cfg.retryBackoff
	for i := 0; i < attempt && d < c.cfg.retryBackoffMax; i++ {
		d *= 2
	}
	d = min(d, c.cfg.retryBackoffMax)
	jitter := 0.8 + 0.4*rand.Float64()
	return time.Duration(float64(d) * jitter)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// retry calls fn until it returns nil or a non-retriable error, waiting backoff between attempts. The
// whole loop is bounded by ctx and by the request timeout (Kafka's admin clients bound a call with its
// retries the same way), and each attempt gets what remains. It returns the last error, or, when the
// time ran out during an attempt, the one before (a "deadline exceeded" says less than why the earlier
// attempts failed), with the number of attempts when there were several.
func (c *cluster) retry(ctx context.Context, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.requestTimeout)
	defer cancel()
	var prev error
	for attempt := 0; ; attempt++ {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil && prev != nil {
			err = prev // cut short by the deadline: report why the earlier attempts failed
		}
		if !retriable(err) {
			return err
		}
		if ctx.Err() != nil || sleep(ctx, c.backoff(attempt)) != nil {
			if attempt > 0 {
				return fmt.Errorf("gave up after %d attempts: %w", attempt+1, err)
			}
			return err
		}
		prev = err
		c.cfg.logger.Debug("retrying", "attempt", attempt+1, "err", err)
	}
}
