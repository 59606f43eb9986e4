package client

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"github.com/runnel-io/runnel/client/batch"
	"github.com/runnel-io/runnel/client/telemetry"
	"google.golang.org/grpc"
)

// Options follow franz-go's kgo.Opt idiom: each With... function returns an option that one or more of
// NewProducer, NewConsumer and NewAdmin accept, documented with its default and the Kafka property it
// mirrors. Constructors apply all options, then validate the result once and return an error naming the
// option at fault; nothing is checked again on the hot path.

// Option configures every kind of client: Producer, Consumer, GroupConsumer and Admin.
type Option interface {
	ProducerOption
	ConsumerOption
	AdminOption
}

// ProducerOption configures NewProducer.
type ProducerOption interface{ applyProducer(*producerConfig) }

// ConsumerOption configures NewConsumer, and NewGroupConsumer too: a group consumer fetches with the
// same machinery, so every ConsumerOption is also a GroupOption.
type ConsumerOption interface {
	applyConsumer(*consumerConfig)
	GroupOption
}

// AdminOption configures NewAdmin.
type AdminOption interface{ applyAdmin(*adminConfig) }

// commonConfig holds what every client shares: how it dials, identifies itself, times out and retries.
type commonConfig struct {
	clientID        string
	requestTimeout  time.Duration
	retryBackoff    time.Duration
	retryBackoffMax time.Duration
	metadataMaxAge  time.Duration
	logger          *slog.Logger
	dialOptions     []grpc.DialOption
	tr              *telemetry.Tracer // from WithTelemetry; meaningful when trSet
	trSet           bool
	errs            []error // problems found while applying options, reported by validate
}

func defaultCommon() commonConfig {
	return commonConfig{
		clientID:        "runnel-go",
		requestTimeout:  30 * time.Second,
		retryBackoff:    100 * time.Millisecond,
		retryBackoffMax: time.Second,
		metadataMaxAge:  5 * time.Minute,
		logger:          slog.New(slog.DiscardHandler),
	}
}

func (c *commonConfig) validate() error {
	var errs []error
	errs = append(errs, c.errs...)
	if c.requestTimeout <= 0 {
		errs = append(errs, fmt.Errorf("WithRequestTimeout(%v): must be positive", c.requestTimeout))
	}
	if c.retryBackoff <= 0 || c.retryBackoffMax < c.retryBackoff {
		errs = append(errs, fmt.Errorf("WithRetryBackoff(%v, %v): need 0 < min <= max", c.retryBackoff, c.retryBackoffMax))
	}
	if c.metadataMaxAge <= 0 {
		errs = append(errs, fmt.Errorf("WithMetadataMaxAge(%v): must be positive", c.metadataMaxAge))
	}
	if c.logger == nil {
		errs = append(errs, errors.New("WithLogger(nil): pass a logger, or leave the option out to log nothing"))
	}
	return errors.Join(errs...)
}

// commonOpt is an Option: it sets the shared part of any client's config.
type commonOpt func(*commonConfig)

func (o commonOpt) applyProducer(c *producerConfig) { o(&c.common) }
func (o commonOpt) applyConsumer(c *consumerConfig) { o(&c.common) }
func (o commonOpt) applyAdmin(c *adminConfig)       { o(&c.common) }
func (o commonOpt) applyGroup(c *groupConfig)       { o(&c.consumer.common) }

// WithClientID names the client to brokers (sent as the gRPC user agent), for their logs and metrics.
// Default "runnel-go". Kafka: client.id.
func WithClientID(id string) Option {
	return commonOpt(func(c *commonConfig) { c.clientID = id })
}

// WithRequestTimeout bounds each request: a produce request unanswered for this long (plus a grace for
// the broker's own answer, since it is also sent as the request's timeout_ms) breaks its stream and is
// retried; an admin or metadata call, retries included, gives up after it. Default 30s. Kafka:
// request.timeout.ms.
func WithRequestTimeout(d time.Duration) Option {
	return commonOpt(func(c *commonConfig) { c.requestTimeout = d })
}

// WithRetryBackoff sets the wait before retrying a retriable error: it starts at min and doubles per
// attempt up to max, with ±20% jitter so clients do not retry in lockstep. Defaults 100ms and 1s. Kafka:
// retry.backoff.ms and retry.backoff.max.ms.
func WithRetryBackoff(min, max time.Duration) Option {
	return commonOpt(func(c *commonConfig) { c.retryBackoff, c.retryBackoffMax = min, max })
}

// WithMetadataMaxAge sets how often cached metadata (partition counts and leaders) is refreshed even
// without an error asking for it, so new partitions are noticed. Default 5m. Kafka: metadata.max.age.ms.
func WithMetadataMaxAge(d time.Duration) Option {
	return commonOpt(func(c *commonConfig) { c.metadataMaxAge = d })
}

// WithLogger sets where the client logs what it does not return as an error (reconnects, retries).
// Default: nothing is logged.
func WithLogger(l *slog.Logger) Option {
	return commonOpt(func(c *commonConfig) { c.logger = l })
}

// WithDialOptions adds gRPC dial options to every connection the client opens (TLS credentials,
// interceptors, keepalive). They are applied after the client's own (plaintext, 128 MiB message caps),
// so they override them. Default none. Note that the node refuses keepalive pings more often than every
// 10s.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return commonOpt(func(c *commonConfig) { c.dialOptions = append(c.dialOptions, opts...) })
}

// WithTelemetry sets the tracer the Producer's batch spans and the consumers' receive and process
// spans come from (see package telemetry and docs/telemetry.md). Default: telemetry.NewTracer(), over
// the global OpenTelemetry tracer provider and propagator, resolved when the client is made; the global
// provider is a no-op until the application installs one, so by default records carry no trace context
// unless Produce's ctx holds a sampled span, and a produced batch costs a no-op span. nil turns tracing
// off entirely: no spans, no headers, not even the no-op span. Admin ignores it.
func WithTelemetry(tr *telemetry.Tracer) Option {
	return commonOpt(func(c *commonConfig) { c.tr, c.trSet = tr, true })
}

// tracer returns the Tracer the client uses: WithTelemetry's, or one over the global provider.
func (c *commonConfig) tracer() *telemetry.Tracer {
	if c.trSet {
		return c.tr
	}
	return telemetry.NewTracer()
}

// Producer options.

// Acks says when a produce request counts as written (Kafka's acks). AcksAll is the default and the
// only setting under which an acknowledged record survives the loss of brokers.
type Acks int8

// Acks settings, numbered as Kafka's acks values.
const (
	// AcksAll: acknowledged once the batch is fsynced and in every in-sync replica (acks=all, -1).
	AcksAll Acks = -1
	// AcksLeader: acknowledged once the leader has written the batch, before fsync (acks=1).
	AcksLeader Acks = 1
	// AcksNone: not acknowledged at all; promises complete once the request is sent, with Offset -1,
	// and broker-side errors are never seen (acks=0).
	AcksNone Acks = 0
)

// String returns Kafka's spelling: "all", "1" or "0".
func (a Acks) String() string {
	switch a {
	case AcksAll:
		return "all"
	case AcksLeader:
		return "1"
	case AcksNone:
		return "0"
	}
	return fmt.Sprintf("Acks(%d)", int8(a))
}

type producerConfig struct {
	common          commonConfig
	acks            Acks
	linger          time.Duration
	batchBytes      int
	maxBuffered     int64
	maxRequestBytes int
	compression     batch.Compression
	partitioner     Partitioner
	deliveryTimeout time.Duration
	maxInFlight     int
	idempotence     bool
	idempotenceSet  bool          // WithIdempotence was given: a conflict with acks is an error, not a silent switch-off
	transactionalID string        // WithTransactionalID; "" when the producer is not transactional
	txnTimeout      time.Duration // WithTransactionTimeout
	txnTimeoutSet   bool
	// openHold bounds how long natural batching (linger 0) holds a batch that is not full for the
	// requests in flight (sink.collect): defaultOpenHold; tests set it.
	openHold time.Duration
}

// defaultOpenHold is the longest a batch that is not full waits, under natural batching, for the
// requests in flight to be answered before it takes a free slot of its own: Kafka 4.0's default
// linger.ms (KIP-1030). An answer that is slower than that (a broker stalled, a slow follower under
// acks=all) then holds up no other partition's records for longer than a Kafka producer's linger
// would, while at the usual round trips (well under a millisecond on a LAN) batches still wait for
// the answer and go together.
const defaultOpenHold = 5 * time.Millisecond

func defaultProducerConfig() producerConfig {
	return producerConfig{
		common:          defaultCommon(),
		acks:            AcksAll,
		linger:          0,
		batchBytes:      1 << 20,
		maxBuffered:     32 << 20,
		maxRequestBytes: 16 << 20,
		compression:     batch.CompressionNone,
		deliveryTimeout: 2 * time.Minute,
		maxInFlight:     5,
		idempotence:     true,
		txnTimeout:      60 * time.Second,
		openHold:        defaultOpenHold,
	}
}

// ProducerDefaults are the settings a Producer has when no option changes them. Tools that describe a
// run (bench/peers' report, the CLI's help) read them here, so the figures they print are the SDK's own
// and cannot drift from it.
type ProducerDefaults struct {
	Acks             Acks          // WithAcks
	Linger           time.Duration // WithLinger; 0: natural batching (a batch that is not full goes when nothing is in flight)
	BatchBytes       int           // WithBatchBytes: bytes of one partition's batch, header included
	MaxBufferedBytes int64         // WithMaxBufferedBytes: each producer's buffer, in bytes
	MaxRequestBytes  int           // WithMaxRequestBytes
	MaxInFlight      int           // WithMaxInFlight: unanswered requests per broker
	DeliveryTimeout  time.Duration // WithDeliveryTimeout
	Idempotence      bool          // WithIdempotence
}

// DefaultProducer returns the defaults NewProducer starts from.
func DefaultProducer() ProducerDefaults {
	c := defaultProducerConfig()
	return ProducerDefaults{Acks: c.acks, Linger: c.linger, BatchBytes: c.batchBytes, MaxBufferedBytes: c.maxBuffered,
		MaxRequestBytes: c.maxRequestBytes, MaxInFlight: c.maxInFlight, DeliveryTimeout: c.deliveryTimeout, Idempotence: c.idempotence}
}

// maxTxnTimeout is the largest transaction timeout the wire carries (int32 milliseconds); the broker's
// transaction.max.timeout.ms (15 minutes by default) is usually lower and refuses more with
// INVALID_TRANSACTION_TIMEOUT.
const maxTxnTimeout = time.Duration(1<<31-1) * time.Millisecond

// maxIdempotentInFlight is how many batches of one partition an idempotent producer has in flight, and
// open (ppart.open), at most: the leader remembers the last 5 batches of each producer id and
// partition, so a retried batch is always recognised as a duplicate (Kafka's
// max.in.flight.requests.per.connection <= 5 rule; Kafka's brokers answer a connection's requests in
// order, which Runnel's streams do not promise, hence the count of open batches).
const maxIdempotentInFlight = 5

// maxMessageBytes is the gRPC message cap the client sets both ways: above the node's 68 MiB so that
// the node, which knows its own limit, is the one to refuse.
const maxMessageBytes = 128 << 20

// maxRequestCap is the largest WithMaxRequestBytes: a request must fit the node's 64 MiB data cap.
const maxRequestCap = 64 << 20

func (c *producerConfig) validate() error {
	errs := []error{c.common.validate()}
	switch c.acks {
	case AcksAll, AcksLeader, AcksNone:
	default:
		errs = append(errs, fmt.Errorf("WithAcks(%d): must be AcksAll, AcksLeader or AcksNone", c.acks))
	}
	if c.linger < 0 {
		errs = append(errs, fmt.Errorf("WithLinger(%v): must not be negative", c.linger))
	}
	if c.batchBytes < 1024 || c.batchBytes > maxRequestCap {
		errs = append(errs, fmt.Errorf("WithBatchBytes(%d): must be within [1 KiB, 64 MiB]", c.batchBytes))
	}
	if c.maxRequestBytes < c.batchBytes || c.maxRequestBytes > maxRequestCap {
		errs = append(errs, fmt.Errorf("WithMaxRequestBytes(%d): must be within [batch bytes %d, 64 MiB]", c.maxRequestBytes, c.batchBytes))
	}
	if c.maxBuffered < int64(c.batchBytes) {
		errs = append(errs, fmt.Errorf("WithMaxBufferedBytes(%d): must be at least the batch bytes (%d)", c.maxBuffered, c.batchBytes))
	}
	if !c.compression.Valid() {
		errs = append(errs, fmt.Errorf("WithCompression(%d): unknown codec", c.compression))
	}
	if c.partitioner == nil {
		errs = append(errs, errors.New("WithPartitioner(nil): pass a partitioner, or leave the option out for Kafka's"))
	}
	if c.deliveryTimeout <= 0 {
		errs = append(errs, fmt.Errorf("WithDeliveryTimeout(%v): must be positive", c.deliveryTimeout))
	}
	if c.maxInFlight < 1 {
		errs = append(errs, fmt.Errorf("WithMaxInFlight(%d): must be at least 1", c.maxInFlight))
	}
	if c.transactionalID != "" {
		// Checked before the idempotence rule, whose message would point at the wrong option.
		if c.idempotenceSet && !c.idempotence {
			errs = append(errs, fmt.Errorf("WithTransactionalID(%q): a transactional producer is idempotent; drop WithIdempotence(false) (Kafka: transactional.id requires enable.idempotence=true)", c.transactionalID))
		}
		if c.acks != AcksAll {
			errs = append(errs, fmt.Errorf("WithTransactionalID(%q): needs WithAcks(AcksAll), not acks=%v (Kafka: transactional.id requires acks=all)", c.transactionalID, c.acks))
		}
		if c.txnTimeout < time.Millisecond || c.txnTimeout > maxTxnTimeout {
			errs = append(errs, fmt.Errorf("WithTransactionTimeout(%v): must be within [1ms, %v]", c.txnTimeout, maxTxnTimeout))
		}
	} else {
		if c.txnTimeoutSet {
			errs = append(errs, fmt.Errorf("WithTransactionTimeout(%v): only a transactional producer has transactions; add WithTransactionalID", c.txnTimeout))
		}
		if c.idempotence && c.acks != AcksAll {
			errs = append(errs, fmt.Errorf("WithIdempotence(true): needs WithAcks(AcksAll), not acks=%v (Kafka: enable.idempotence=true requires acks=all)", c.acks))
		}
	}
	return errors.Join(errs...)
}

// resolve settles the options that depend on each other, before validate. As in Kafka 3.x, acks other
// than all turn idempotence off unless WithIdempotence(true) asked for it explicitly, which validate
// then refuses.
func (c *producerConfig) resolve() {
	if c.transactionalID != "" {
		// A transactional producer is idempotent (KIP-98); validate refuses WithIdempotence(false) and
		// acks other than all rather than switching anything off.
		if !c.idempotenceSet {
			c.idempotence = true
		}
		return
	}
	if !c.idempotenceSet && c.acks != AcksAll {
		c.idempotence = false
	}
}

type producerOpt func(*producerConfig)

func (o producerOpt) applyProducer(c *producerConfig) { o(c) }

// WithAcks sets when the broker acknowledges a produce request. Default AcksAll. Kafka: acks.
//
// Idempotence needs AcksAll: AcksLeader or AcksNone switch it off unless WithIdempotence(true) is given
// too, in which case NewProducer fails (Kafka 3.x does the same).
func WithAcks(a Acks) ProducerOption {
	return producerOpt(func(c *producerConfig) { c.acks = a })
}

// WithLinger sets how long a partition's batch waits for more records after its first one before it
// is sent, trading latency for larger batches. A batch goes sooner when full, on Flush, or when
// Produce is waiting for buffer space. Default 0: natural batching, as franz-go's default and
// Kafka's linger.ms=0 do. A full batch is sent as soon as its broker's stream has a request slot
// free (fewer than WithMaxInFlight requests unanswered). A batch that is not full is sent when no
// request to its broker is in flight, or along with a request that goes anyway (another partition's
// full batch) when that request has room for it (else in the next request), or once it has waited 5
// ms (Kafka 4.0's default linger) for the answers, and records accumulate into it meanwhile, so the
// request sent when the last answer comes holds what came during its round trip: Nagle's algorithm,
// which holds small segments while data is unacknowledged (RFC 896), applied to requests. Under a
// light load a record therefore waits one or two round trips (plus the broker's fsync with
// AcksAll), not a linger; a producer below full speed keeps about one request in flight instead of
// a stream of small ones (at half its maximum, filling every slot made about 3 times the requests,
// each costing both ends CPU: docs/performance.md); under a heavy load the requests in flight keep
// the batches large, up to WithBatchBytes, and a linger only adds latency. Under a light load
// natural batching buys latency with CPU: the requests go one round trip apart, so both ends stay
// about as busy as near full speed. One producer at 150,000 records/s of 100 bytes against a local
// node sent 90,000 requests in 10 s, using 0.72 of a core on the node and 0.54 in the client, for a
// p50 of 0.18 ms and a p99 of 1.0 ms; with a 1 ms linger it sent 7,200-7,600, using 0.12-0.16 and
// 0.11-0.14 of a core, for 1.5-1.65 and 2.6-3.0 ms (docs/performance.md, "What a request costs
// below the maximum"). A linger also makes batches larger for compression. A linger under 1 ms acts
// as about 1 ms while the producer's process is otherwise idle: the Go runtime's network poller then
// sleeps in whole milliseconds. With a linger, a batch whose linger has passed goes whenever a slot
// is free, as in Kafka. With AcksNone no request waits for an answer,
// so nothing is ever in flight and every batch goes at once. Kafka: linger.ms (whose default was 0
// until Kafka 4.0 made it 5ms).
func WithLinger(d time.Duration) ProducerOption {
	return producerOpt(func(c *producerConfig) { c.linger = d })
}

// WithBatchBytes sets the most uncompressed bytes (header included) one partition's batch collects
// before it is sealed and a new one started. A record larger than this goes alone in its own batch.
// Keep it at most the topics' max.message.bytes (1048588 by default), since the broker refuses larger
// batches with MESSAGE_TOO_LARGE. Within [1 KiB, 64 MiB]; default 1 MiB. Kafka: batch.size (whose
// default is 16 KiB; batches over gRPC gain from being larger).
func WithBatchBytes(n int) ProducerOption {
	return producerOpt(func(c *producerConfig) { c.batchBytes = n })
}

// WithMaxBufferedBytes caps the bytes of records produced but not yet acknowledged (counted as their
// encoded size). Produce blocks while the cap would be exceeded, until acknowledgements free space or its
// context ends; a single record larger than the cap fails with MESSAGE_TOO_LARGE. At least the batch
// bytes; default 32 MiB, Kafka's buffer.memory default. A larger buffer adds only queueing: one producer
// reaches the same throughput with 32 MiB as with 64 MiB, and many producers in one process run faster
// with less (16 producers: about a quarter more records/s than with 64 MiB each), as they hold fewer
// records and batch buffers in flight: less fresh memory to fault in, more of it in the CPU caches.
// Kafka: buffer.memory (with max.block.ms replaced by Produce's context).
func WithMaxBufferedBytes(n int64) ProducerOption {
	return producerOpt(func(c *producerConfig) { c.maxBuffered = n })
}

// WithMaxRequestBytes caps the batch bytes of one produce request (one batch per partition, many
// partitions). A record whose encoded size exceeds it fails at once with MESSAGE_TOO_LARGE, never sent.
// Within [batch bytes, 64 MiB]; default 16 MiB. Kafka: max.request.size.
func WithMaxRequestBytes(n int) ProducerOption {
	return producerOpt(func(c *producerConfig) { c.maxRequestBytes = n })
}

// WithCompression sets the codec batches are compressed with (the record area as a whole, Kafka's
// format); a batch that compression would not shrink is sent uncompressed. Default
// batch.CompressionNone. Kafka: compression.type.
func WithCompression(codec batch.Compression) ProducerOption {
	return producerOpt(func(c *producerConfig) { c.compression = codec })
}

// WithPartitioner sets how records with Partition -1 are given a partition. Default
// NewKafkaPartitioner(): murmur2 of the key as Kafka's Java client, keyless records sticky per batch.
// Kafka: partitioner.class.
func WithPartitioner(p Partitioner) ProducerOption {
	return producerOpt(func(c *producerConfig) { c.partitioner = p })
}

// WithDeliveryTimeout bounds the time from Produce to the promise: the wait for the topic's metadata,
// linger, sending and every retry. A record not acknowledged by then fails with the last retriable error
// seen (or REQUEST_TIMED_OUT). Default 2m. Kafka: delivery.timeout.ms (and max.block.ms for the
// metadata wait).
func WithDeliveryTimeout(d time.Duration) ProducerOption {
	return producerOpt(func(c *producerConfig) { c.deliveryTimeout = d })
}

// WithMaxInFlight caps the produce requests awaiting an answer on one broker's stream. A request
// carries at most one batch per partition, so this also caps each partition's batches in flight. The
// stream appends requests in send order, so pipelining keeps each partition's order; after a retriable
// error a partition is re-sent only once its in-flight requests are answered. At least 1; default 5.
// Kafka: max.in.flight.requests.per.connection.
//
// An idempotent producer keeps at most 5 batches of any one partition in flight whatever n is, since
// the broker remembers the last 5 batches per producer and partition to recognise a retried one. Kafka
// has the same bound (it refuses, or with idempotence left implicit switches idempotence off for, a
// max.in.flight.requests.per.connection over 5); here a larger n still pipelines more requests over
// the stream, for other partitions.
func WithMaxInFlight(n int) ProducerOption {
	return producerOpt(func(c *producerConfig) { c.maxInFlight = n })
}

// WithIdempotence turns the idempotent producer (KIP-98) on or off. Default true. Kafka:
// enable.idempotence.
//
// An idempotent producer asks the cluster for a producer id (InitProducerId) before its first batch is
// sent, and numbers each partition's records with a sequence carried in every batch. The partition's
// leader remembers the last 5 batches of each producer id and partition: a retried batch it already
// stored (its answer was lost, or came too late) is acknowledged with its original offsets rather than
// written again, and a batch that would leave a gap in the sequence is refused. So retries after
// timeouts, broken streams or leader changes never write a record twice, and the records of a partition
// are stored in the order they were produced. A Producer has at most 5 batches of any one partition in
// flight (see WithMaxInFlight).
//
// What it does not cover: each Producer gets a new producer id, so records that an application sends
// again after a restart (or through another Producer) are new records; use transactions or idempotent
// consumers for end-to-end exactly-once.
//
// Errors. A retriable error is retried as without idempotence: the same batch (same bytes, same
// sequence), in order, within the delivery timeout. OUT_OF_ORDER_SEQUENCE_NUMBER (the leader misses an
// earlier batch), INVALID_PRODUCER_EPOCH (a newer epoch of the producer id exists) and
// UNKNOWN_PRODUCER_ID (the leader no longer knows the producer id) are not retriable: they fail the
// batch, and every later batch of the partition already numbered under the same producer id (in flight
// or queued; their sequences are out of order now too) fails with "... after an earlier batch failed:"
// and the first error wrapped (errors.Is matches it). So does any other final failure of a numbered
// batch, a non-retriable error or its delivery timeout, since it too leaves a gap. This mirrors Kafka,
// where these errors are fatal for the idempotent producer's batches of the partition; as Kafka's
// producer then resets its producer id, the Producer takes a new one and the partition's next batches
// start again at sequence 0 under it (ProducerID changes). Two exceptions, also Kafka's: an
// OUT_OF_ORDER_SEQUENCE_NUMBER answer while an earlier batch of the partition is unresolved (in flight
// or to be retried) is retried after it, and DUPLICATE_SEQUENCE_NUMBER counts as written (with Offset
// -1, the leader not saying where).
//
// Idempotence needs acks=all: with WithAcks(AcksLeader) or WithAcks(AcksNone) it is switched off unless
// WithIdempotence(true) is given explicitly, which NewProducer refuses (as Kafka 3.x). A cluster that
// does not implement InitProducerId (codes.Unimplemented) gets a non-idempotent producer when
// idempotence is left at its default (a warning is logged), and records that fail with
// UNSUPPORTED_VERSION when WithIdempotence(true) was given.
func WithIdempotence(enabled bool) ProducerOption {
	return producerOpt(func(c *producerConfig) { c.idempotence, c.idempotenceSet = enabled, true })
}

// WithTransactionalID makes the producer transactional (KIP-98): it writes records to several
// partitions, and the offsets of the records it consumed (SendOffsetsToTransaction), as one atomic unit
// that read_committed consumers see entirely or not at all. id names the producer across restarts: a
// new Producer with the same id fences the previous one (its later writes and commits fail with
// ErrProducerFenced), so a crashed instance's "zombie" cannot write after its replacement started.
// Default "" (not transactional). Kafka: transactional.id.
//
// It implies idempotence and acks=all: WithIdempotence(false) or WithAcks other than AcksAll make
// NewProducer fail. The producer must call InitTransactions once before anything else, then
// BeginTransaction, Produce..., and CommitTransaction or AbortTransaction; Produce outside a
// transaction fails with ErrTxnState. See Producer for the whole protocol.
func WithTransactionalID(id string) ProducerOption {
	return producerOpt(func(c *producerConfig) { c.transactionalID = id })
}

// WithTransactionTimeout sets how long a transaction may stay open: the coordinator aborts one that is
// not ended within it of its first partition being added (and fences the producer, whose later calls
// fail with ErrProducerFenced wrapping ErrTransactionAborted). Within [1ms, 2^31-1 ms] on the client; the
// broker refuses more than its transaction.max.timeout.ms (15 minutes by default) with
// INVALID_TRANSACTION_TIMEOUT from InitTransactions. Only with WithTransactionalID. Default 60s. Kafka:
// transaction.timeout.ms.
func WithTransactionTimeout(d time.Duration) ProducerOption {
	return producerOpt(func(c *producerConfig) { c.txnTimeout, c.txnTimeoutSet = d, true })
}

// Consumer options.

// IsolationLevel says which records a consumer reads (Kafka's isolation.level).
type IsolationLevel int8

// Isolation levels.
const (
	// ReadUncommitted reads every record up to the high watermark, including those of transactions
	// still open or aborted. The default, as in Kafka.
	ReadUncommitted IsolationLevel = iota
	// ReadCommitted reads up to the last stable offset (LSO: the first offset of the oldest transaction
	// still open) and never returns records of aborted transactions (KIP-98).
	ReadCommitted
)

// String returns Kafka's spelling: "read_uncommitted" or "read_committed".
func (l IsolationLevel) String() string {
	switch l {
	case ReadUncommitted:
		return "read_uncommitted"
	case ReadCommitted:
		return "read_committed"
	}
	return fmt.Sprintf("IsolationLevel(%d)", int8(l))
}

// ParseIsolationLevel parses "read_committed" or "read_uncommitted" (Kafka's spellings; "-" may stand
// for "_").
func ParseIsolationLevel(s string) (IsolationLevel, error) {
	switch s {
	case "read_uncommitted", "read-uncommitted":
		return ReadUncommitted, nil
	case "read_committed", "read-committed":
		return ReadCommitted, nil
	}
	return 0, fmt.Errorf("isolation level %q: want read_committed or read_uncommitted", s)
}

func (l IsolationLevel) proto() runnelv1.IsolationLevel {
	if l == ReadCommitted {
		return runnelv1.IsolationLevel_READ_COMMITTED
	}
	return runnelv1.IsolationLevel_READ_UNCOMMITTED
}

type consumerConfig struct {
	common            commonConfig
	fetchMaxBytes     int32
	fetchMinBytes     int32
	fetchMaxWait      time.Duration
	partitionMaxBytes int32
	isolation         IsolationLevel
	// trustPositions: positions come from the group's commits and from fetched records, never past a
	// log end the leader once had, so an answer that puts one past the log end is taken as a stale
	// broker's and fetched again for outOfRangeGrace (set by GroupConsumer). A plain Consumer does so
	// only for positions at or below a high watermark it has seen.
	trustPositions bool
}

func defaultConsumerConfig() consumerConfig {
	return consumerConfig{
		common:            defaultCommon(),
		fetchMaxBytes:     50 << 20,
		fetchMinBytes:     1,
		fetchMaxWait:      500 * time.Millisecond,
		partitionMaxBytes: 1 << 20,
	}
}

func (c *consumerConfig) validate() error {
	errs := []error{c.common.validate()}
	if c.fetchMaxBytes < 1 || c.fetchMaxBytes > 64<<20 {
		errs = append(errs, fmt.Errorf("WithFetchMaxBytes(%d): must be within [1, 64 MiB]", c.fetchMaxBytes))
	}
	if c.fetchMinBytes < 0 {
		errs = append(errs, fmt.Errorf("WithFetchMinBytes(%d): must not be negative", c.fetchMinBytes))
	}
	if c.fetchMaxWait < 0 || c.fetchMaxWait > time.Minute {
		errs = append(errs, fmt.Errorf("WithFetchMaxWait(%v): must be within [0, 1m]", c.fetchMaxWait))
	}
	if c.partitionMaxBytes < 1 || c.partitionMaxBytes > 64<<20 {
		errs = append(errs, fmt.Errorf("WithPartitionMaxBytes(%d): must be within [1, 64 MiB]", c.partitionMaxBytes))
	}
	if c.isolation != ReadUncommitted && c.isolation != ReadCommitted {
		errs = append(errs, fmt.Errorf("WithIsolationLevel(%d): must be ReadCommitted or ReadUncommitted", c.isolation))
	}
	return errors.Join(errs...)
}

type consumerOpt func(*consumerConfig)

func (o consumerOpt) applyConsumer(c *consumerConfig) { o(c) }
func (o consumerOpt) applyGroup(c *groupConfig)       { o(&c.consumer) }

// WithFetchMaxBytes caps the record bytes of one fetch answer over all its partitions; the first batch
// is returned even when larger, so a consumer never stalls on a big batch (KIP-74). Within [1, 64 MiB];
// default 50 MiB. Kafka: fetch.max.bytes.
func WithFetchMaxBytes(n int32) ConsumerOption {
	return consumerOpt(func(c *consumerConfig) { c.fetchMaxBytes = n })
}

// WithFetchMinBytes sets how many record bytes a fetch waits for (up to the max wait) before the broker
// answers; larger values mean fewer, fuller answers. At least 0; default 1. Kafka: fetch.min.bytes.
func WithFetchMinBytes(n int32) ConsumerOption {
	return consumerOpt(func(c *consumerConfig) { c.fetchMinBytes = n })
}

// WithFetchMaxWait sets how long the broker holds a fetch waiting for the min bytes (the long poll).
// Within [0, 1m]; default 500ms. Kafka: fetch.max.wait.ms.
func WithFetchMaxWait(d time.Duration) ConsumerOption {
	return consumerOpt(func(c *consumerConfig) { c.fetchMaxWait = d })
}

// WithPartitionMaxBytes caps the record bytes one partition contributes to a fetch answer (again at
// least one batch). Within [1, 64 MiB]; default 1 MiB. Kafka: max.partition.fetch.bytes.
func WithPartitionMaxBytes(n int32) ConsumerOption {
	return consumerOpt(func(c *consumerConfig) { c.partitionMaxBytes = n })
}

// WithIsolationLevel sets which records the consumer reads: ReadCommitted stops at the last stable
// offset and drops the records of aborted transactions; ReadUncommitted (the default, as Kafka's)
// reads everything up to the high watermark. Control batches (transaction markers) are never returned
// in either mode, though positions move past them. OffsetLatest resolves to the last stable offset
// under ReadCommitted. A GroupConsumer reading committed also asks for its committed offsets with
// require_stable (KIP-447), so it does not start a partition while a transaction's offset commit to it
// is still open. Kafka: isolation.level.
func WithIsolationLevel(l IsolationLevel) ConsumerOption {
	return consumerOpt(func(c *consumerConfig) { c.isolation = l })
}

// Admin options: only the shared ones so far.

type adminConfig struct {
	common commonConfig
}

func (c *adminConfig) validate() error { return c.common.validate() }

func newProducerConfig(opts []ProducerOption) (producerConfig, error) {
	cfg := defaultProducerConfig()
	cfg.partitioner = NewKafkaPartitioner()
	for _, o := range opts {
		if o == nil {
			cfg.common.errs = append(cfg.common.errs, errors.New("nil ProducerOption"))
			continue
		}
		o.applyProducer(&cfg)
	}
	cfg.resolve()
	if err := cfg.validate(); err != nil {
		return cfg, fmt.Errorf("client: invalid producer options: %w", err)
	}
	return cfg, nil
}

func newConsumerConfig(opts []ConsumerOption) (consumerConfig, error) {
	cfg := defaultConsumerConfig()
	for _, o := range opts {
		if o == nil {
			cfg.common.errs = append(cfg.common.errs, errors.New("nil ConsumerOption"))
			continue
		}
		o.applyConsumer(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return cfg, fmt.Errorf("client: invalid consumer options: %w", err)
	}
	return cfg, nil
}

func newAdminConfig(opts []AdminOption) (adminConfig, error) {
	cfg := adminConfig{common: defaultCommon()}
	for _, o := range opts {
		if o == nil {
			cfg.common.errs = append(cfg.common.errs, errors.New("nil AdminOption"))
			continue
		}
		o.applyAdmin(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return cfg, fmt.Errorf("client: invalid admin options: %w", err)
	}
	return cfg, nil
}
