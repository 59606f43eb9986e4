package telemetry

import (
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// ScopeName is the instrumentation scope of every tracer and meter of this package (the otel_scope_name
// of its metrics, the library of its spans).
const ScopeName = "github.com/runnel-io/runnel/client/telemetry"

// SystemName is the value of messaging.system on every span and of nothing else: metrics are Runnel's
// own, so their names say it already.
const SystemName = "runnel"

// Names of the metric instruments, with their units and attributes. This is the one list: the broker
// records them (broker.go, groups.go), docs/telemetry.md documents them and the Grafana dashboard
// (deploy/grafana/runnel-dashboard.json) queries them under their Prometheus names, given beside each.
// Only what is recorded today is defined; functions and connectors add theirs here when they land.
const (
	// MetricBytesIn counts the bytes of record batches appended to a partition, as produced (compressed
	// size, headers included). Counter, unit By; attributes AttrTopic, AttrPartition.
	// Prometheus: runnel_partition_in_bytes_total.
	MetricBytesIn = "runnel.partition.in"
	// MetricRecordsIn counts the records appended to a partition (the record counts of the batch
	// headers). Counter, unit {record}; attributes AttrTopic, AttrPartition.
	// Prometheus: runnel_partition_in_records_total.
	MetricRecordsIn = "runnel.partition.in.records"
	// MetricBytesOut counts the bytes of record batches returned by fetches of a partition. Counter,
	// unit By; attributes AttrTopic, AttrPartition. Prometheus: runnel_partition_out_bytes_total.
	MetricBytesOut = "runnel.partition.out"
	// MetricRecordsOut counts the records of the batches returned by fetches (whole batches: a consumer
	// that starts inside a batch skips its first records, and they still count). Counter, unit
	// {record}; attributes AttrTopic, AttrPartition. Prometheus: runnel_partition_out_records_total.
	MetricRecordsOut = "runnel.partition.out.records"
	// MetricProduceDuration is the time from a produce request's arrival to its answer, so with acks=all
	// it includes the fsync. Histogram, unit s; attributes AttrAcks and, when a partition failed,
	// AttrErrorType. Prometheus: runnel_produce_duration_seconds.
	MetricProduceDuration = "runnel.produce.duration"
	// MetricFetchDuration is the time from a fetch request's arrival to its answer, long-poll wait
	// (max_wait_ms) included, as Kafka's fetch TotalTimeMs. Histogram, unit s; attribute AttrErrorType
	// when the fetch failed. Prometheus: runnel_fetch_duration_seconds.
	MetricFetchDuration = "runnel.fetch.duration"
	// MetricConsumerLag is, per group and partition with a committed offset, the high watermark minus the
	// committed offset, computed when metrics are collected. Gauge, unit {record}; attributes AttrGroup,
	// AttrTopic, AttrPartition. Prometheus: runnel_consumer_lag.
	MetricConsumerLag = "runnel.consumer.lag"
	// MetricGroupMembers is the number of members of each group with membership state, static members
	// that left and whose partitions are still reserved included. Gauge, unit {member}; attribute
	// AttrGroup. Prometheus: runnel_group_members.
	MetricGroupMembers = "runnel.group.members"
	// MetricRebalances counts group epoch bumps: every change of membership, subscriptions, subscribed
	// topics' partitions or assignor starts a rebalance (KIP-848). Counter, unit {rebalance}; attribute
	// AttrGroup. Prometheus: runnel_group_rebalances_total.
	MetricRebalances = "runnel.group.rebalances"
	// MetricRebalanceDuration is the time from an epoch bump of a group that was settled until it is
	// settled again: every member owns its target at the assignment epoch, or the group is empty. Bumps
	// during a rebalance extend it. Histogram, unit s; attribute AttrGroup.
	// Prometheus: runnel_group_rebalance_duration_seconds.
	MetricRebalanceDuration = "runnel.group.rebalance.duration"
	// MetricLSMSize is the size of the Badger LSM tree files (.sst: the offset index and partition state).
	// Gauge, unit By. Prometheus: runnel_storage_lsm_size_bytes.
	MetricLSMSize = "runnel.storage.lsm.size"
	// MetricVlogSize is the size of the Badger value-log files (.vlog: the record batches). Gauge, unit
	// By. Prometheus: runnel_storage_vlog_size_bytes.
	MetricVlogSize = "runnel.storage.vlog.size"
	// MetricVlogGCRuns counts value-log GC passes by AttrGCResult. Counter, unit {run}.
	// Prometheus: runnel_storage_vlog_gc_runs_total.
	MetricVlogGCRuns = "runnel.storage.vlog.gc.runs"
	// MetricISRShrinks and MetricISRExpands count the ISR changes a leader made by AttrTopic and
	// AttrPartition (Kafka's IsrShrinksPerSec and IsrExpandsPerSec). Counter, unit {change}.
	// Prometheus: runnel_partition_isr_shrinks_total, runnel_partition_isr_expands_total.
	MetricISRShrinks = "runnel.partition.isr.shrinks"
	// MetricLeaderPartitions, MetricUnderReplicated and MetricOfflinePartitions are partition health:
	// partitions led here, those of them with a short ISR, and (on the controller leader) partitions
	// without a leader. Gauges, unit {partition}. Prometheus: runnel_partitions_leader,
	// runnel_partitions_under_replicated, runnel_partitions_offline.
	MetricLeaderPartitions  = "runnel.partitions.leader"
	MetricUnderReplicated   = "runnel.partitions.under_replicated"
	MetricOfflinePartitions = "runnel.partitions.offline"
	// MetricFollowerLag is how many offsets each follower is behind the leader's log end, reported by
	// the leader with AttrTopic, AttrPartition and AttrFollower (Kafka's replica lag). Gauge, unit
	// {record}. Prometheus: runnel_partition_follower_lag.
	MetricFollowerLag = "runnel.partition.follower.lag"
	MetricISRExpands  = "runnel.partition.isr.expands"
	// MetricTxnOpen is the number of transactions ongoing or being ended (PREPARE_*: markers being
	// written) on the transaction coordinators this broker runs, read at collection. Gauge, unit
	// {transaction}. Prometheus: runnel_transactions_open.
	MetricTxnOpen = "runnel.transactions.open"
	// MetricTxnCommitted counts the transactions this broker's coordinators decided to commit (KIP-98:
	// the PREPARE_COMMIT decision; markers follow). Counter, unit {transaction}.
	// Prometheus: runnel_transactions_committed_total.
	MetricTxnCommitted = "runnel.transactions.committed"
	// MetricTxnAborted counts the transactions this broker's coordinators decided to abort, by
	// AttrAbortReason. Counter, unit {transaction}. Prometheus: runnel_transactions_aborted_total.
	MetricTxnAborted = "runnel.transactions.aborted"
	// MetricTxnDuration is the time from a transaction's start (its first AddPartitionsToTxn or
	// AddOffsetsToTxn) to its commit or abort decision. Histogram, unit s; attribute AttrTxnOutcome.
	// Prometheus: runnel_transaction_duration_seconds.
	MetricTxnDuration = "runnel.transaction.duration"
)

// Attribute keys of the metrics above and of the spans. They are the OpenTelemetry messaging semantic
// conventions' where one exists.
const (
	// AttrTopic is the topic name (messaging.destination.name).
	AttrTopic = semconv.MessagingDestinationNameKey
	// AttrPartition is the partition number as a decimal string, as the conventions want it
	// (messaging.destination.partition.id).
	AttrPartition = semconv.MessagingDestinationPartitionIDKey
	// AttrFollower is the broker id of a follower (runnel.follower).
	AttrFollower = attribute.Key("runnel.follower")
	// AttrLeader is the broker id of a partition's leader, on a follower's replicate span
	// (runnel.leader).
	AttrLeader = attribute.Key("runnel.leader")
	// AttrGroup is the consumer group id (messaging.consumer.group.name).
	AttrGroup = semconv.MessagingConsumerGroupNameKey
	// AttrErrorType is the catalogue error code name (UNKNOWN_TOPIC_OR_PARTITION, ...) of a failed
	// request, or "_OTHER" (error.type).
	AttrErrorType = semconv.ErrorTypeKey
	// AttrAcks is the produce request's acks: "all", "leader" or "none".
	AttrAcks = attribute.Key("runnel.acks")
	// AttrGCResult is the outcome of a value-log GC pass: "rewritten" (a file was rewritten), "nothing"
	// (no file had enough garbage) or "error".
	AttrGCResult = attribute.Key("runnel.gc.result")
	// AttrOffset is one record's offset (the Kafka convention's messaging.kafka.offset, under Runnel's
	// system name).
	AttrOffset = attribute.Key("messaging.runnel.offset")
	// AttrBaseOffset is the offset given to the first record of an appended batch (or of the first of
	// several batches).
	AttrBaseOffset = attribute.Key("messaging.runnel.base_offset")
	// AttrMessageKey is a record's key, when it is valid UTF-8 (messaging.kafka.message.key's analogue).
	AttrMessageKey = attribute.Key("messaging.runnel.message.key")
	// AttrBatchBytes is the size in bytes of the record batches of a span's partition.
	AttrBatchBytes = attribute.Key("messaging.runnel.batch.bytes")
	// AttrHighWatermark is a fetched partition's high watermark.
	AttrHighWatermark = attribute.Key("messaging.runnel.high_watermark")
	// AttrFetchOffset is the first offset a fetch asked for.
	AttrFetchOffset = attribute.Key("messaging.runnel.fetch_offset")
	// AttrAbortReason is why a transaction was aborted: TxnAbortClient, TxnAbortTimeout,
	// TxnAbortFenced or TxnAbortOperator (runnel.txn.abort_reason).
	AttrAbortReason = attribute.Key("runnel.txn.abort_reason")
	// AttrTxnOutcome is a decided transaction's outcome: "commit" or "abort" (runnel.txn.outcome).
	AttrTxnOutcome = attribute.Key("runnel.txn.outcome")
)

// Operation names (messaging.operation.name) and span names' first word. The operation types
// (messaging.operation.type) are the conventions' send, receive and process; "publish" is the older
// conventions' name of send.
const (
	OpSend    = "send"
	OpReceive = "receive"
	OpProcess = "process"
	// OpAppend is the broker's span for one partition of a produce request.
	OpAppend = "append"
	// OpReplicate is a follower's span for one batch it copied from the leader, the child of the
	// leader's append span (replication.go).
	OpReplicate = "replicate"
)

// latencyBuckets are the histogram bounds, in seconds, of the request latencies: from an unsynced
// append (~100µs) through fsyncs (ms) to long polls (up to MaxFetchWait, 60 s).
var latencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// rebalanceBuckets are the bounds, in seconds, of rebalance durations: from one heartbeat (instant
// when a single member joins) to rebalance timeouts (300 s by default).
var rebalanceBuckets = []float64{0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
