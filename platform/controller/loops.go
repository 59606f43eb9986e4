package controller

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/runnel-io/runnel/api/rerr"
	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/broker/meta"
	"github.com/runnel-io/runnel/platform/membership"
)

// leaderLoop runs the leader's duties while this node leads the quorum: it takes over on election
// (barrier, cluster id, fresh heartbeat clocks, fencing what serf already knows failed) and fences
// brokers whose heartbeats stopped.
func (c *Controller) leaderLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.HeartbeatInterval / 2)
	defer t.Stop()
	changes := c.q.LeaderChanges()
	lastElect := time.Now()
	for {
		select {
		case <-c.stop:
			return
		case <-changes:
		case <-t.C:
		}
		leader := c.q.IsLeader()
		c.hbMu.Lock()
		was := c.leading
		c.hbMu.Unlock()
		switch {
		case leader && !was:
			c.takeOver()
		case !leader && was:
			c.hbMu.Lock()
			c.leading = false
			c.hbMu.Unlock()
			c.log.Info("no longer the controller leader")
		case leader:
			c.checkSessions()
			if time.Since(lastElect) >= c.cfg.PreferredElectionInterval {
				lastElect = time.Now()
				c.electPreferred()
			}
		}
	}
}

// ctx returns a context that ends after d or when the controller stops.
func (c *Controller) ctx(d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	go func() {
		select {
		case <-c.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func (c *Controller) takeOver() {
	ctx, cancel := c.ctx(10 * time.Second)
	defer cancel()
	// Act only on a state that holds every entry committed before this term (Raft §8).
	if err := c.q.Barrier(ctx); err != nil {
		c.log.Warn("new controller leader could not catch up its metadata", "err", err)
		return
	}
	if c.fsm.Image().ClusterID == "" {
		id := uuid.NewString()
		if _, err := c.proposeAsLeader(ctx, meta.Command{Type: meta.CmdInitCluster, ClusterID: id}); err != nil {
			c.log.Warn("choosing the cluster id failed", "err", err)
			return
		}
		c.log.Info("cluster id chosen", "cluster_id", id)
	}
	now := time.Now()
	c.hbMu.Lock()
	c.leading = true
	c.lastSeen = map[int32]time.Time{}
	for _, b := range c.fsm.Image().BrokerList() {
		c.lastSeen[b.ID] = now
	}
	c.hbMu.Unlock()
	st := c.q.Status()
	c.log.Info("controller leader", "node_id", c.cfg.Self.ID, "term", st.Term, "metadata_offset", c.fsm.Image().Offset)
	if c.memb != nil {
		for _, m := range c.memb.Members() {
			if m.Status == membership.StatusFailed || m.Status == membership.StatusLeft {
				c.fence(m.Tags.NodeID, "serf: "+m.Status.String())
			}
		}
	}
}

// electPreferred moves leaderships back to preferred replicas that are alive and in sync (Kafka's
// auto.leader.rebalance.enable), so the brokers that came back after a failover lead their share again.
func (c *Controller) electPreferred() {
	movable := false
	for _, t := range c.fsm.Image().TopicList() {
		for _, p := range t.Assignment {
			movable = movable || c.fsm.Image().PreferredLeaderMovable(p)
		}
	}
	if !movable {
		return
	}
	ctx, cancel := c.ctx(5 * time.Second)
	defer cancel()
	if _, err := c.proposeAsLeader(ctx, meta.Command{Type: meta.CmdElectPreferredLeaders}); err != nil {
		c.log.Warn("preferred leader election failed", "err", err)
		return
	}
	c.log.Info("preferred leaders elected")
}

// checkSessions fences alive brokers whose last heartbeat is older than the session timeout.
func (c *Controller) checkSessions() {
	now := time.Now()
	var late []int32
	c.hbMu.Lock()
	for _, b := range c.fsm.Image().AliveBrokers() {
		last, ok := c.lastSeen[b.ID]
		if !ok {
			c.lastSeen[b.ID] = now
			continue
		}
		if now.Sub(last) > c.cfg.SessionTimeout {
			late = append(late, b.ID)
		}
	}
	c.hbMu.Unlock()
	for _, id := range late {
		c.fence(id, "no heartbeat within the session timeout")
	}
}

// fence fences broker id if it is alive (leader only).
func (c *Controller) fence(id int32, reason string) {
	b, ok := c.fsm.Image().Broker(id)
	if !ok || b.Fenced || !c.q.IsLeader() {
		return
	}
	ctx, cancel := c.ctx(5 * time.Second)
	defer cancel()
	if _, err := c.proposeAsLeader(ctx, meta.Command{Type: meta.CmdFenceBroker, BrokerID: id, BrokerEpoch: b.Epoch, Reason: reason}); err != nil {
		c.log.Warn("fencing a broker failed", "broker", id, "reason", reason, "err", err)
		return
	}
	c.log.Info("broker fenced", "broker", id, "reason", reason)
}

// membershipLoop fences brokers serf reports failed or left, on the leader.
func (c *Controller) membershipLoop() {
	defer c.wg.Done()
	events := c.memb.Events()
	for {
		select {
		case <-c.stop:
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			switch ev.Kind {
			case membership.EventFailed, membership.EventLeave:
				c.log.Info("cluster member gone", "node_id", ev.Member.Tags.NodeID, "event", ev.Kind.String())
				c.hbMu.Lock()
				leading := c.leading
				c.hbMu.Unlock()
				if leading {
					c.fence(ev.Member.Tags.NodeID, "serf: "+ev.Kind.String())
				}
			case membership.EventJoin:
				c.log.Info("cluster member joined", "node_id", ev.Member.Tags.NodeID, "role", ev.Member.Tags.Role)
			}
		}
	}
}

// brokerLoop registers this node as a broker, then heartbeats every HeartbeatInterval, registering
// again when the controller no longer knows this incarnation.
func (c *Controller) brokerLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.HeartbeatInterval)
	defer t.Stop()
	failures := 0
	for {
		if err := c.beat(); err != nil {
			failures++
			if failures == 1 || failures%20 == 0 {
				c.log.Warn("broker heartbeat to the controller failed", "failures", failures, "err", err)
			}
		} else {
			failures = 0
		}
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
	}
}

func (c *Controller) beat() error {
	ctx, cancel := c.ctx(c.cfg.SessionTimeout)
	defer cancel()
	epoch := c.Epoch()
	if epoch == 0 {
		self := c.cfg.Self
		resp, err := c.propose(ctx, meta.Command{Type: meta.CmdRegisterBroker, Broker: &self}.Encode(), false)
		if err != nil {
			return err
		}
		if e := rerr.FromInfo(resp.Error); e != nil {
			return e
		}
		epoch = resp.BrokerEpoch
		c.epochMu.Lock()
		c.epoch = epoch
		c.epochMu.Unlock()
		c.log.Info("broker registered", "node_id", self.ID, "epoch", epoch, "incarnation", self.Incarnation)
	}
	_, err := c.heartbeat(ctx, &runnelv1.BrokerHeartbeatRequest{NodeId: c.cfg.Self.ID, BrokerEpoch: epoch, MetadataOffset: c.fsm.Image().Offset})
	if err != nil {
		var e *rerr.Error
		if errors.As(err, &e) && (e.Code == runnelv1.ErrorCode_STALE_BROKER_EPOCH || e.Code == runnelv1.ErrorCode_BROKER_ID_NOT_REGISTERED) {
			c.epochMu.Lock()
			c.epoch = 0
			c.epochMu.Unlock()
		}
		return err
	}
	return nil
}
