// Package client is Runnel's Go SDK: a Producer, a Consumer of assigned partitions, a GroupConsumer
// (a member of a consumer group) and an Admin client, talking gRPC to the brokers (api/runnel/v1).
// Records travel as Kafka RecordBatch v2, built and read by the batch subpackage; errors are the
// catalogue of api/rerr, compared with errors.Is (or, for the group codes, errors.As to *rerr.Error
// and its Code).
//
// Quick tour:
//
//	p, err := client.NewProducer([]string{"127.0.0.1:7070"}, client.WithLinger(10*time.Millisecond))
//	p.Produce(ctx, client.NewRecord("orders", key, value), func(r *client.Record, err error) { ... })
//	err = p.ProduceSync(ctx, client.NewRecord("orders", key, value))
//	p.Close() // flushes
//
//	pool := recordpool.New(func(r *client.Record, err error) { ... }) // at high rates: records reused in blocks
//	r, promise := pool.Next()
//	r.Topic, r.Partition, r.Value = "orders", -1, value
//	p.Produce(ctx, r, promise)
//
//	c, err := client.NewConsumer([]string{"127.0.0.1:7070"})
//	err = c.Assign("orders", 0, client.OffsetEarliest())
//	recs, err := c.Poll(ctx)
//	n, err := c.PollFunc(ctx, func(r *client.Record) { ... }) // r valid during the call only: for throughput
//
//	g, err := client.NewGroupConsumer([]string{"127.0.0.1:7070"}, "billing",
//		client.WithAutoOffsetReset(client.OffsetEarliest()))
//	err = g.Subscribe("orders")
//	for {
//		recs, err := g.Poll(ctx) // the records of the previous Poll now count as processed
//		... // process recs
//	}
//	g.Close() // commits what Poll returned, leaves the group
//
//	for { // or, for throughput: r valid during the call only, nothing allocated per record
//		n, err := g.PollFunc(ctx, func(r *client.Record) { ... })
//		err = g.CommitSync(ctx) // optional (auto-commit is on): what fn saw, committed now
//	}
//
//	a, err := client.NewAdmin([]string{"127.0.0.1:7070"})
//	end, _, err := a.ListOffsets(ctx, "orders", 0, client.OffsetLatest()) // a partition's end offset
//	c, err := g.Committed(ctx, client.TopicPartition{Topic: "orders", Partition: 0})
//
// From another module: the SDK is not published yet, so depend on a checkout of this repository
// with a replace directive (`go mod edit -replace github.com/runnel-io/runnel=../runnel`, then
// `go mod tidy` once your code imports it); it needs the Go version in this repository's go.mod.
//
// Consumer groups follow Kafka's KIP-848 ("the next generation of the consumer rebalance protocol"):
// the broker computes the assignment and moves partitions one by one, so members not concerned by a
// rebalance keep reading through it. The GroupConsumer has the shape of Kafka's KafkaConsumer with
// subscribe (a separate type rather than an option of NewConsumer, so that Assign and Subscribe
// cannot be mixed): Subscribe or SubscribeRegex, Poll, CommitSync/CommitAsync/CommitOffsets,
// Seek, Pause/Resume, and rebalance callbacks (WithOnAssigned, WithOnRevoked, WithOnLost) that run
// inside Poll. Auto-commit is on by default and commits only processed records: those returned by a
// Poll before the latest one, so a crash re-delivers and never skips. A partition without a committed
// offset starts at the latest offset by default (Kafka's auto.offset.reset=latest); set
// WithAutoOffsetReset(OffsetEarliest()) to read a new group's topics from the start.
//
// The Producer is idempotent by default (KIP-98, WithIdempotence): it takes a producer id from the
// cluster and numbers each partition's batches, so a batch it retries after a timeout, a broken stream
// or a leader change is stored once, and a partition's records are stored in the order they were
// produced. It needs acks=all (the default); a new Producer has a new id, so records sent again after
// a restart are new records.
//
// Transactions (KIP-98, with KIP-447's group-fenced offsets and KIP-890's partition verification):
// a Producer made WithTransactionalID writes records to several partitions, and a group's offsets,
// as one atomic unit; consumers WithIsolationLevel(ReadCommitted) see all of it once it commits and
// none of it if it aborts. Consume-transform-produce, exactly once:
//
//	p, err := client.NewProducer(brokers, client.WithTransactionalID("enricher-1"))
//	err = p.InitTransactions(ctx) // fences any previous producer with this id
//	g, err := client.NewGroupConsumer(brokers, "enricher", client.WithAutoCommit(false),
//		client.WithIsolationLevel(client.ReadCommitted))
//	err = g.Subscribe("orders")
//	for {
//		recs, err := g.Poll(ctx) // returns when records arrive or ctx ends
//		err = p.BeginTransaction()
//		first := map[client.TopicPartition]int64{} // where to go back to if the transaction aborts
//		offsets := map[client.TopicPartition]client.OffsetAndMetadata{}
//		for _, r := range recs {
//			tp := client.TopicPartition{Topic: r.Topic, Partition: r.Partition}
//			if _, ok := first[tp]; !ok {
//				first[tp] = r.Offset
//			}
//			p.Produce(ctx, client.NewRecord("enriched", r.Key, enrich(r.Value)), nil)
//			offsets[tp] = client.OffsetAndMetadata{Offset: r.Offset + 1}
//		}
//		if err = p.SendOffsetsToTransaction(ctx, offsets, g.GroupMetadata()); err == nil {
//			err = p.CommitTransaction(ctx) // if ctx ran out, calling it again is safe
//		}
//		if errors.Is(err, client.ErrProducerFenced) {
//			return err // a newer instance took over: stop
//		} else if err != nil {
//			if err := p.AbortTransaction(ctx); err != nil {
//				return err // outcome unknown: restart, and resume from the group's committed offsets
//			}
//			for tp, off := range first {
//				g.Seek(tp.Topic, tp.Partition, off) // read the aborted records again
//			}
//		}
//	}
//
// e2e/copier is this loop as a program; the e2e tests kill it with kill -9 while it works and check
// that every input record is in the output exactly once.
//
// Options are functional (With...), each documented with its default and the Kafka property it
// mirrors; the constructors validate them once. Shared options (WithClientID, WithRequestTimeout,
// WithRetryBackoff, WithMetadataMaxAge, WithLogger, WithDialOptions) fit every client; consumer
// options (fetch sizes and waits) fit both consumers.
//
// Tracing goes through package telemetry (WithTelemetry; by default the global OpenTelemetry
// provider): a "send" span per produced batch whose W3C trace context travels in its records' headers,
// a "receive" span per Poll, and StartProcess for the span of processing one record, linked to the
// producer's. See docs/telemetry.md.
//
// Choices that differ from Kafka's Java client, and why:
//   - linger defaults to 0 (Kafka 4.0: 5 ms; 0 before it, and in franz-go): natural batching. A
//     full batch is sent as soon as its broker's stream has a request slot free (fewer than
//     WithMaxInFlight unanswered); a batch that is not full is sent when no request to its broker
//     is in flight, or along with a request that goes anyway and has room for it, or after waiting
//     5 ms for the answers, and grows meanwhile, as Nagle's algorithm holds small segments while
//     data is unacknowledged (RFC 896). So under light load a record waits one or two round trips,
//     not a linger, a producer below full speed keeps about one request in flight instead of
//     filling every slot with small ones, and at full speed the requests in flight keep batches
//     large.
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
