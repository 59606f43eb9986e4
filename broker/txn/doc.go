// Package txn is the deterministic core of Runnel's transaction coordinator: Kafka's KIP-98
// transactions, with KIP-447's group offsets in transactions and KIP-890's server-side verification of
// transactional writes, and the transactional ids' state kept as records of the compacted internal
// topic __transaction_state (StateTopic).
//
// # Shape: a core and a shell
//
// A Coordinator holds the transactional ids of one __transaction_state partition (PartitionFor: the
// same hash as group ids). Like broker/group's core it is a state machine with no goroutines, no clock
// and no I/O: calls take now, change the state in memory and return the records to append; the broker
// (broker/txns.go, on the shard machinery of broker/stateshard.go) appends them acks=all, hands them
// back through Apply once durable, and only then answers. Refused calls change nothing.
//
// # States (txn.proto's TxnState, Kafka's TransactionState)
//
//	InitProducerId      new id → EMPTY at epoch 0 (a new producer id); EMPTY/COMPLETE_* → EMPTY at epoch+1
//	                    (past MaxProducerEpoch: a new producer id at epoch 0); ONGOING → PREPARE_ABORT at
//	                    epoch+1 and CONCURRENT_TRANSACTIONS; PREPARE_* → CONCURRENT_TRANSACTIONS
//	AddPartitionsToTxn  EMPTY/COMPLETE_* → ONGOING (start time now); ONGOING → ONGOING (more partitions)
//	AddOffsetsToTxn     the same, for the group's __consumer_offsets partition
//	EndTxn              ONGOING → PREPARE_COMMIT or PREPARE_ABORT at epoch+1 (KIP-890 part 2; the answer
//	                    carries the new epoch); anything else is a no-op or a refusal
//	Complete            PREPARE_x → COMPLETE_x, once every partition has its marker (the shell's call)
//	Tick                ONGOING past its timeout → PREPARE_ABORT at epoch+1; ids idle for IDExpiration
//	                    are forgotten (a tombstone: Kafka's DEAD)
//	AbortTransaction    ONGOING → PREPARE_ABORT at epoch+1 (the operator's abort)
//
// Every transaction ends at a bumped epoch (KIP-890 part 2): the producer's own EndTxn answers the new
// epoch, which its next transaction uses, with sequences from 0; the markers carry it, so a late write
// of the ended transaction is refused by every partition (its epoch is older) and by verification,
// instead of being admitted into the next transaction of the same epoch, where its commit would make
// records of an aborted transaction visible. A retried EndTxn with the replaced epoch (lastEpoch,
// kept in the record so it survives a coordinator failover) gets the same answer. The producer calls
// InitProducerId once its epoch reaches math.MaxInt16, for a new producer id.
//
// Aborts that are not the producer's own bump the epoch too, so the producer is fenced (PRODUCER_FENCED at
// the coordinator, INVALID_PRODUCER_EPOCH at the partitions, whose markers carry the new epoch): a
// zombie can neither commit nor write into a transaction the coordinator aborted. InitProducerId never
// hands out math.MaxInt16, and a producer that EndTxn moved to it must call InitProducerId before its
// next transaction, so that bump always fits.
//
// # Markers
//
// The markers of a transaction must be written only once its decision cannot be lost: the core hands
// out a transaction's Marker (TakePrepared) only after its PREPARE_* record came back through Apply, or
// through Load when a new leader replays the partition (it resumes what the previous leader did not
// finish; markers are idempotent per producer epoch). Until Complete, the id answers
// CONCURRENT_TRANSACTIONS to InitProducerId, AddPartitionsToTxn and AddOffsetsToTxn.
//
// # Verification (KIP-890)
//
// A partition leader asks VerifyPartitions before the first transactional batch of a producer epoch on
// a partition: it is accepted only when the partition is in that producer's ONGOING transaction. A
// produce that arrives after EndTxn (or after a timeout abort) finds PREPARE_*/COMPLETE_* or a newer
// epoch and is refused, so it cannot leave a transaction open on the partition that no marker will
// ever end.
//
// # Records
//
// records.go: one record per transactional id, its value the whole state (a versioned
// TransactionDescription), so compaction keeps exactly the latest state per id. Load skips records
// that do not decode (FuzzDecodeRecord).
package txn
