package txn

import (
	"fmt"
	"time"
)

// Limits on request fields, so no request can make the coordinator store or loop over unbounded data.
const (
	// MaxIDBytes caps transactional ids and group ids (bytes of UTF-8), as broker/group caps group ids.
	MaxIDBytes = 255
	// MaxPartitions caps the partitions of one transaction (and of one AddPartitionsToTxn or
	// VerifyPartitions): its markers are written in one WriteTxnMarkers per leader.
	MaxPartitions = 100_000
	// MaxListed caps the ids of one DescribeTransactions.
	MaxListed = 10_000
)

// Config holds the transaction coordinator's settings, each named after the Kafka broker property it
// mirrors. Zero fields take the defaults of DefaultConfig, so Config{} is valid.
type Config struct {
	// DefaultTimeout is the transaction timeout of an InitProducerId that asks for none (the producer's
	// transaction.timeout.ms default, 60s).
	DefaultTimeout time.Duration
	// MaxTimeout caps the transaction timeout a producer may ask for (transaction.max.timeout.ms, 15m);
	// above it InitProducerId fails with INVALID_TRANSACTION_TIMEOUT.
	MaxTimeout time.Duration
	// IDExpiration is how long a transactional id may go unused, with no transaction ongoing, before the
	// coordinator forgets it (transactional.id.expiration.ms, 7 days). IDExpirationCheckInterval is how
	// often that is checked (transaction.remove.expired.transaction.cleanup.interval.ms, 1h).
	IDExpiration              time.Duration
	IDExpirationCheckInterval time.Duration
	// StateTopicPartitions is the partition count of __transaction_state when the broker creates it
	// (transaction.state.log.num.partitions, 50). Used by the broker, not by the Coordinator.
	StateTopicPartitions int32
	// TickInterval is how often the broker drives Coordinator.Tick, which aborts transactions past their
	// timeout (transaction.abort.timed.out.transaction.cleanup.interval.ms is 10s in Kafka; 1s here, so a
	// timeout fires at most a second late). Used by the broker, not by the Coordinator.
	TickInterval time.Duration
}

// DefaultConfig returns Kafka's defaults (see each field).
func DefaultConfig() Config {
	return Config{
		DefaultTimeout:            time.Minute,
		MaxTimeout:                15 * time.Minute,
		IDExpiration:              7 * 24 * time.Hour,
		IDExpirationCheckInterval: time.Hour,
		StateTopicPartitions:      50,
		TickInterval:              time.Second,
	}
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	for _, f := range []struct{ v, dv *time.Duration }{
		{&c.DefaultTimeout, &d.DefaultTimeout}, {&c.MaxTimeout, &d.MaxTimeout}, {&c.IDExpiration, &d.IDExpiration},
		{&c.IDExpirationCheckInterval, &d.IDExpirationCheckInterval}, {&c.TickInterval, &d.TickInterval},
	} {
		if *f.v == 0 {
			*f.v = *f.dv
		}
	}
	if c.StateTopicPartitions == 0 {
		c.StateTopicPartitions = d.StateTopicPartitions
	}
	return c
}

// Validate reports settings that cannot work: durations under a millisecond, a default timeout above
// the max, timeouts that do not fit the wire's int32 milliseconds, a partition count below one.
func (c Config) Validate() error {
	c = c.WithDefaults()
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"default timeout", c.DefaultTimeout}, {"max timeout", c.MaxTimeout}, {"transactional id expiration", c.IDExpiration},
		{"transactional id expiration check interval", c.IDExpirationCheckInterval}, {"tick interval", c.TickInterval},
	} {
		if d.v < time.Millisecond {
			return fmt.Errorf("transaction config: %s %v must be at least 1ms", d.name, d.v)
		}
	}
	if c.MaxTimeout > time.Duration(1<<31-1)*time.Millisecond {
		return fmt.Errorf("transaction config: max timeout %v must fit in int32 milliseconds", c.MaxTimeout)
	}
	if c.DefaultTimeout > c.MaxTimeout {
		return fmt.Errorf("transaction config: default timeout %v is above the max %v", c.DefaultTimeout, c.MaxTimeout)
	}
	if c.StateTopicPartitions < 1 {
		return fmt.Errorf("transaction config: %d state topic partitions, at least 1", c.StateTopicPartitions)
	}
	return nil
}
