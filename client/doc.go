// Package client is Runnel's Go SDK: a Producer, a Consumer of assigned partitions and an Admin client,
// talking gRPC to the brokers (api/runnel/v1). Records travel as Kafka RecordBatch v2, built and read
// by the batch subpackage; errors are the catalogue of api/rerr, compared with errors.Is.
//
// Quick tour:
//
//	p, err := client.NewProducer([]string{"127.0.0.1:7070"}, client.WithLinger(10*time.Millisecond))
//	p.Produce(ctx, client.NewRecord("orders", key, value), func(r *client.Record, err error) { ... })
//	err = p.ProduceSync(ctx, client.NewRecord("orders", key, value))
//	p.Close() // flushes
//
//	c, err := client.NewConsumer([]string{"127.0.0.1:7070"})
//	err = c.Assign("orders", 0, client.OffsetEarliest())
//	recs, err := c.Poll(ctx)
//
// Options are functional (With...), each documented with its default and the Kafka property it
// mirrors; the constructors validate them once. Shared options (WithClientID, WithRequestTimeout,
// WithRetryBackoff, WithMetadataMaxAge, WithLogger, WithDialOptions) fit all three clients.
//
// Choices that differ from Kafka's Java client, and why:
//   - batch.size defaults to 1 MiB (Kafka: 16 KiB): a gRPC request costs more than a Kafka one, and
//     large batches are what lets one producer write a million records a second.
//   - A batch that compression does not shrink is sent uncompressed.
//   - Produce blocks for metadata and buffer space only as long as its context allows (max.block.ms is
//     the context; metadata waits are also capped by the delivery timeout).
//   - The delivery timeout is not required to exceed linger + request timeout; a record simply fails
//     when its delivery timeout passes, whatever it was waiting for.
//
// The brokers argument is a list of host:port; the SDK does not read RUNNEL_BROKERS (the CLI does).
package client
