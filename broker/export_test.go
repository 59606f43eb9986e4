package broker

import (
	"context"

	"github.com/runnel-io/runnel/broker/plog"
)

// AppendForTest appends batches to the log of a partition this broker leads as they are, bypassing
// produce's checks: node tests stage transactional batches as a leader admitted them earlier, without
// a transaction coordinator.
func (b *Broker) AppendForTest(ctx context.Context, topic string, partition int32, batches []byte) (plog.AppendResult, error) {
	t, p, err := b.partition(topic, partition)
	if err != nil {
		return plog.AppendResult{}, err
	}
	st, _ := t.Partition(partition)
	return p.Append(ctx, batches, plog.AppendOptions{Sync: true, LogAppendTime: -1, LeaderEpoch: st.LeaderEpoch})
}
