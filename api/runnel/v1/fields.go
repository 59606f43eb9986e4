package runnelv1

import "google.golang.org/protobuf/encoding/protowire"

// Field numbers of the messages that the SDK and the node encode or decode by hand, without the
// protobuf runtime, to reference record bytes instead of copying them (client/produce_codec.go and
// broker/produce_codec.go for ProduceRequest; broker/fetch_codec.go and client/fetch_codec.go for
// FetchResponse). They must match runnel.proto; the codecs' tests compare them with the generated
// descriptors, so a field added, renumbered or retyped there fails those tests until the codecs know it.
const (
	// ProduceRequest.
	FieldProduceCorrelationID   protowire.Number = 1
	FieldProduceAcks            protowire.Number = 2
	FieldProduceTimeoutMs       protowire.Number = 3
	FieldProducePartitions      protowire.Number = 4
	FieldProduceTransactionalID protowire.Number = 5

	// ProducePartition.
	FieldPartitionTopic              protowire.Number = 1
	FieldPartitionPartition          protowire.Number = 2
	FieldPartitionRecords            protowire.Number = 3
	FieldPartitionTraceContext       protowire.Number = 4
	FieldPartitionCurrentLeaderEpoch protowire.Number = 5

	// The entry message of every protobuf map field (map<K, V> is repeated {K key = 1; V value = 2;}).
	FieldMapKey   protowire.Number = 1
	FieldMapValue protowire.Number = 2

	// FetchResponse.
	FieldFetchPartitions protowire.Number = 1

	// FetchPartitionResult.
	FieldResultTopic               protowire.Number = 1
	FieldResultPartition           protowire.Number = 2
	FieldResultError               protowire.Number = 3
	FieldResultHighWatermark       protowire.Number = 4
	FieldResultLastStableOffset    protowire.Number = 5
	FieldResultLogStartOffset      protowire.Number = 6
	FieldResultRecords             protowire.Number = 7
	FieldResultAbortedTransactions protowire.Number = 8
)
