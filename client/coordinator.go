package client

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"

	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
)

// TopicPartition names one partition of a topic.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// String returns "topic-partition", Kafka's spelling.
func (k TopicPartition) String() string { return k.Topic + "-" + strconv.Itoa(int(k.Partition)) }

// sortTopicPartitions sorts by topic, then partition.
func sortTopicPartitions(ps []TopicPartition) {
	slices.SortFunc(ps, func(a, b TopicPartition) int {
		if c := cmp.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return cmp.Compare(a.Partition, b.Partition)
	})
}

// toProtoPartitions groups partitions by topic for the wire, sorted.
func toProtoPartitions(ps []TopicPartition) []*runnelv1.TopicPartitions {
	ps = slices.Clone(ps)
	sortTopicPartitions(ps)
	var out []*runnelv1.TopicPartitions
	for _, k := range ps {
		if n := len(out); n > 0 && out[n-1].Topic == k.Topic {
			if l := out[n-1].Partitions; l[len(l)-1] != k.Partition {
				out[n-1].Partitions = append(l, k.Partition)
			}
			continue
		}
		out = append(out, &runnelv1.TopicPartitions{Topic: k.Topic, Partitions: []int32{k.Partition}})
	}
	return out
}

// fromProtoPartitions flattens the wire's partitions by topic, sorted and without duplicates.
func fromProtoPartitions(ps []*runnelv1.TopicPartitions) []TopicPartition {
	var out []TopicPartition
	for _, t := range ps {
		if t == nil {
			continue
		}
		for _, p := range t.Partitions {
			out = append(out, TopicPartition{t.Topic, p})
		}
	}
	sortTopicPartitions(out)
	return slices.Compact(out)
}

// isCode reports whether err carries the catalogue error code. api/rerr has sentinels only for the
// record-path codes; group codes are compared this way.
func isCode(err error, code runnelv1.ErrorCode) bool {
	var e *rerr.Error
	return errors.As(err, &e) && e.Code == code
}

// coordinator routes the calls of one group's Groups service to the broker that coordinates the group
// (the leader of its __consumer_offsets partition). The Groups API has no FindCoordinator call, so the
// first call goes to any broker; an answer NOT_COORDINATOR (or COORDINATOR_NOT_AVAILABLE) that names a
// node in its leader id moves the calls there, and one that does not makes the next call try another
// broker. A single node always coordinates every group.
type coordinator struct {
	cl *cluster
	coordNode
}

// coordNode is where a coordinator (of a group, or of a transactional id) was last found: -1 when
// unknown. Group and transaction coordinators move the same way (with the leader of their internal
// topic's partition), so both clients follow them with failed.
type coordNode struct {
	mu   sync.Mutex
	node int32
}

func newCoordinator(cl *cluster) *coordinator {
	return &coordinator{cl: cl, coordNode: coordNode{node: -1}}
}

// client returns a Groups client on the coordinator's connection (or any broker's). A coordinator
// named by a broker whose address this client has not learnt yet (it bootstrapped from other nodes)
// is looked up in fresh metadata first.
func (c *coordinator) client(ctx context.Context) (runnelv1.GroupsClient, error) {
	c.mu.Lock()
	node := c.node
	c.mu.Unlock()
	if node >= 0 && !c.cl.knows(node) {
		if _, err := c.cl.metadataOnce(ctx, []string{}); err != nil {
			return nil, err
		}
	}
	cc, err := c.cl.nodeConn(node) // an unknown node (-1) is any broker
	if err != nil {
		return nil, err
	}
	return runnelv1.NewGroupsClient(cc), nil
}

// failed notes an error of a call: errors saying the broker does not (or no longer) coordinate, and
// transport failures, make the next call look elsewhere (or go where NOT_COORDINATOR points).
func (c *coordNode) failed(err error) {
	var e *rerr.Error
	if !errors.As(err, &e) {
		return
	}
	switch e.Code {
	case runnelv1.ErrorCode_NOT_COORDINATOR, runnelv1.ErrorCode_COORDINATOR_NOT_AVAILABLE:
		c.mu.Lock()
		c.node = -1
		if e.LeaderID >= 0 {
			c.node = e.LeaderID
		}
		c.mu.Unlock()
	case runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, runnelv1.ErrorCode_REQUEST_TIMED_OUT:
		// A transport failure (the broker is unreachable, say): try another broker next time.
		c.mu.Lock()
		c.node = -1
		c.mu.Unlock()
	}
}

// call runs one Groups call with the cluster's retry policy: retriable failures of the whole call
// (coordinator moving or loading, broker unreachable) are retried within the request timeout and ctx;
// other errors are returned at once.
func (c *coordinator) call(ctx context.Context, fn func(ctx context.Context, gc runnelv1.GroupsClient) error) error {
	return unfinal(c.cl.retry(ctx, func(ctx context.Context) error {
		gc, err := c.client(ctx)
		if err != nil {
			return err
		}
		err = fn(ctx, gc)
		if err != nil {
			c.failed(err)
		}
		return err
	}))
}
