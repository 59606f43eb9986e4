// Package rerr is Runnel's one error catalogue: the wire error codes of api/runnel/v1 as Go errors, which
// of them are retriable, and their mapping to and from gRPC status codes with a typed ErrorInfo detail.
//
// The broker returns *Error values (usually wrapped with context); the API edge turns them into gRPC
// statuses with ToStatus or into per-partition results with ToInfo; the client turns them back with
// FromStatus or FromInfo. Callers branch with errors.Is against the sentinels below, which match any
// *Error with the same code (the franz-go kerr idiom).
package rerr

import (
	"errors"
	"fmt"
	"strings"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error is one wire error: a catalogue code plus what went wrong. LeaderID and LeaderEpoch are set with
// NOT_LEADER_OR_FOLLOWER (-1 when unknown).
type Error struct {
	Code        runnelv1.ErrorCode
	Message     string
	LeaderID    int32
	LeaderEpoch int32
}

// Error returns "CODE_NAME: message".
func (e *Error) Error() string {
	if e.Message == "" {
		return e.Code.String()
	}
	return e.Code.String() + ": " + e.Message
}

// Is reports whether target is an *Error with the same code, so errors.Is(err, rerr.ErrOffsetOutOfRange)
// holds for any offset-out-of-range error whatever its message.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code
	}
	return false
}

// Retriable reports whether the same request may succeed when sent again later.
func (e *Error) Retriable() bool { return Retriable(e.Code) }

// Sentinels, one per code that callers branch on. Compare with errors.Is.
var (
	ErrOffsetOutOfRange         = &Error{Code: runnelv1.ErrorCode_OFFSET_OUT_OF_RANGE}
	ErrCorruptMessage           = &Error{Code: runnelv1.ErrorCode_CORRUPT_MESSAGE}
	ErrUnknownTopicOrPartition  = &Error{Code: runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION}
	ErrInvalidFetchSize         = &Error{Code: runnelv1.ErrorCode_INVALID_FETCH_SIZE}
	ErrLeaderNotAvailable       = &Error{Code: runnelv1.ErrorCode_LEADER_NOT_AVAILABLE}
	ErrNotLeaderOrFollower      = &Error{Code: runnelv1.ErrorCode_NOT_LEADER_OR_FOLLOWER}
	ErrRequestTimedOut          = &Error{Code: runnelv1.ErrorCode_REQUEST_TIMED_OUT}
	ErrMessageTooLarge          = &Error{Code: runnelv1.ErrorCode_MESSAGE_TOO_LARGE}
	ErrInvalidTopic             = &Error{Code: runnelv1.ErrorCode_INVALID_TOPIC_EXCEPTION}
	ErrRecordListTooLarge       = &Error{Code: runnelv1.ErrorCode_RECORD_LIST_TOO_LARGE}
	ErrNotEnoughReplicas        = &Error{Code: runnelv1.ErrorCode_NOT_ENOUGH_REPLICAS}
	ErrNotEnoughReplicasAfter   = &Error{Code: runnelv1.ErrorCode_NOT_ENOUGH_REPLICAS_AFTER_APPEND}
	ErrInvalidRequiredAcks      = &Error{Code: runnelv1.ErrorCode_INVALID_REQUIRED_ACKS}
	ErrInvalidTimestamp         = &Error{Code: runnelv1.ErrorCode_INVALID_TIMESTAMP}
	ErrUnsupportedVersion       = &Error{Code: runnelv1.ErrorCode_UNSUPPORTED_VERSION}
	ErrTopicAlreadyExists       = &Error{Code: runnelv1.ErrorCode_TOPIC_ALREADY_EXISTS}
	ErrInvalidPartitions        = &Error{Code: runnelv1.ErrorCode_INVALID_PARTITIONS}
	ErrInvalidReplicationFactor = &Error{Code: runnelv1.ErrorCode_INVALID_REPLICATION_FACTOR}
	ErrInvalidConfig            = &Error{Code: runnelv1.ErrorCode_INVALID_CONFIG}
	ErrInvalidRequest           = &Error{Code: runnelv1.ErrorCode_INVALID_REQUEST}
	ErrUnsupportedForFormat     = &Error{Code: runnelv1.ErrorCode_UNSUPPORTED_FOR_MESSAGE_FORMAT}
	ErrInvalidRecord            = &Error{Code: runnelv1.ErrorCode_INVALID_RECORD}
	ErrStorage                  = &Error{Code: runnelv1.ErrorCode_KAFKA_STORAGE_ERROR}
	ErrUnknownServerError       = &Error{Code: runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR}
	ErrNotController            = &Error{Code: runnelv1.ErrorCode_NOT_CONTROLLER}
	ErrFencedLeaderEpoch        = &Error{Code: runnelv1.ErrorCode_FENCED_LEADER_EPOCH}
	ErrUnknownLeaderEpoch       = &Error{Code: runnelv1.ErrorCode_UNKNOWN_LEADER_EPOCH}
	ErrStaleBrokerEpoch         = &Error{Code: runnelv1.ErrorCode_STALE_BROKER_EPOCH}
	ErrInvalidUpdateVersion     = &Error{Code: runnelv1.ErrorCode_INVALID_UPDATE_VERSION}
	ErrDuplicateBroker          = &Error{Code: runnelv1.ErrorCode_DUPLICATE_BROKER_REGISTRATION}
	ErrBrokerNotRegistered      = &Error{Code: runnelv1.ErrorCode_BROKER_ID_NOT_REGISTERED}
	ErrInconsistentClusterID    = &Error{Code: runnelv1.ErrorCode_INCONSISTENT_CLUSTER_ID}
	ErrOutOfOrderSequence       = &Error{Code: runnelv1.ErrorCode_OUT_OF_ORDER_SEQUENCE_NUMBER}
	ErrDuplicateSequence        = &Error{Code: runnelv1.ErrorCode_DUPLICATE_SEQUENCE_NUMBER}
	ErrInvalidProducerEpoch     = &Error{Code: runnelv1.ErrorCode_INVALID_PRODUCER_EPOCH}
	ErrUnknownProducerID        = &Error{Code: runnelv1.ErrorCode_UNKNOWN_PRODUCER_ID}
	ErrInvalidTxnState          = &Error{Code: runnelv1.ErrorCode_INVALID_TXN_STATE}
	ErrInvalidProducerIDMapping = &Error{Code: runnelv1.ErrorCode_INVALID_PRODUCER_ID_MAPPING}
	ErrInvalidTxnTimeout        = &Error{Code: runnelv1.ErrorCode_INVALID_TRANSACTION_TIMEOUT}
	ErrConcurrentTransactions   = &Error{Code: runnelv1.ErrorCode_CONCURRENT_TRANSACTIONS}
	ErrTxnCoordinatorFenced     = &Error{Code: runnelv1.ErrorCode_TRANSACTION_COORDINATOR_FENCED}
	ErrUnstableOffsetCommit     = &Error{Code: runnelv1.ErrorCode_UNSTABLE_OFFSET_COMMIT}
	ErrProducerFenced           = &Error{Code: runnelv1.ErrorCode_PRODUCER_FENCED}
	ErrTransactionalIDNotFound  = &Error{Code: runnelv1.ErrorCode_TRANSACTIONAL_ID_NOT_FOUND}
)

// New returns an *Error with code and a formatted message.
func New(code runnelv1.ErrorCode, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), LeaderID: -1, LeaderEpoch: -1}
}

// Retriable reports whether a request that failed with code may succeed when retried, as Kafka marks
// its error codes retriable. The idempotent producer's sequence errors are not (OUT_OF_ORDER_SEQUENCE_NUMBER,
// DUPLICATE_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH, UNKNOWN_PRODUCER_ID): sending the same batch again
// cannot change the answer; the producer decides itself when an out-of-order answer only reflects an
// earlier batch it is still retrying.
func Retriable(code runnelv1.ErrorCode) bool {
	switch code {
	case runnelv1.ErrorCode_CORRUPT_MESSAGE, // Kafka retries it: the bytes may have been damaged in transit
		runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION, // metadata may not have propagated yet
		runnelv1.ErrorCode_LEADER_NOT_AVAILABLE,
		runnelv1.ErrorCode_NOT_LEADER_OR_FOLLOWER,
		runnelv1.ErrorCode_REQUEST_TIMED_OUT,
		runnelv1.ErrorCode_NOT_ENOUGH_REPLICAS,
		runnelv1.ErrorCode_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
		runnelv1.ErrorCode_KAFKA_STORAGE_ERROR,
		runnelv1.ErrorCode_COORDINATOR_LOAD_IN_PROGRESS,
		runnelv1.ErrorCode_COORDINATOR_NOT_AVAILABLE,
		runnelv1.ErrorCode_NOT_COORDINATOR,
		runnelv1.ErrorCode_REBALANCE_IN_PROGRESS,
		runnelv1.ErrorCode_NOT_CONTROLLER,           // a new controller leader is being elected
		runnelv1.ErrorCode_FENCED_LEADER_EPOCH,      // the client's metadata is older than the leader's
		runnelv1.ErrorCode_UNKNOWN_LEADER_EPOCH,     // the broker's metadata is older than the client's
		runnelv1.ErrorCode_BROKER_ID_NOT_REGISTERED, // the registration is still being applied
		runnelv1.ErrorCode_CONCURRENT_TRANSACTIONS,  // the previous transaction's markers are being written
		runnelv1.ErrorCode_UNSTABLE_OFFSET_COMMIT:   // a transaction holding the offsets is being ended
		return true
	}
	return false
}

// GRPCCode is the gRPC status code a call that fails as a whole with code returns.
func GRPCCode(code runnelv1.ErrorCode) codes.Code {
	switch code {
	case runnelv1.ErrorCode_NONE:
		return codes.OK
	case runnelv1.ErrorCode_OFFSET_OUT_OF_RANGE:
		return codes.OutOfRange
	case runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION:
		return codes.NotFound
	case runnelv1.ErrorCode_TOPIC_ALREADY_EXISTS:
		return codes.AlreadyExists
	case runnelv1.ErrorCode_GROUP_ID_NOT_FOUND:
		return codes.NotFound
	case runnelv1.ErrorCode_COORDINATOR_LOAD_IN_PROGRESS, runnelv1.ErrorCode_COORDINATOR_NOT_AVAILABLE:
		return codes.Unavailable
	case runnelv1.ErrorCode_NOT_COORDINATOR, runnelv1.ErrorCode_UNKNOWN_MEMBER_ID, runnelv1.ErrorCode_FENCED_MEMBER_EPOCH,
		runnelv1.ErrorCode_STALE_MEMBER_EPOCH, runnelv1.ErrorCode_ILLEGAL_GENERATION, runnelv1.ErrorCode_FENCED_INSTANCE_ID,
		runnelv1.ErrorCode_UNRELEASED_INSTANCE_ID, runnelv1.ErrorCode_NON_EMPTY_GROUP, runnelv1.ErrorCode_REBALANCE_IN_PROGRESS:
		return codes.FailedPrecondition
	case runnelv1.ErrorCode_GROUP_MAX_SIZE_REACHED:
		return codes.ResourceExhausted
	case runnelv1.ErrorCode_LEADER_NOT_AVAILABLE, runnelv1.ErrorCode_NOT_ENOUGH_REPLICAS,
		runnelv1.ErrorCode_NOT_ENOUGH_REPLICAS_AFTER_APPEND, runnelv1.ErrorCode_KAFKA_STORAGE_ERROR:
		return codes.Unavailable
	case runnelv1.ErrorCode_NOT_LEADER_OR_FOLLOWER, runnelv1.ErrorCode_FENCED_LEADER_EPOCH,
		runnelv1.ErrorCode_UNKNOWN_LEADER_EPOCH, runnelv1.ErrorCode_STALE_BROKER_EPOCH,
		runnelv1.ErrorCode_INVALID_UPDATE_VERSION, runnelv1.ErrorCode_BROKER_ID_NOT_REGISTERED:
		return codes.FailedPrecondition
	case runnelv1.ErrorCode_NOT_CONTROLLER:
		return codes.Unavailable
	case runnelv1.ErrorCode_DUPLICATE_BROKER_REGISTRATION, runnelv1.ErrorCode_INCONSISTENT_CLUSTER_ID:
		return codes.FailedPrecondition
	case runnelv1.ErrorCode_OUT_OF_ORDER_SEQUENCE_NUMBER, runnelv1.ErrorCode_DUPLICATE_SEQUENCE_NUMBER,
		runnelv1.ErrorCode_INVALID_PRODUCER_EPOCH, runnelv1.ErrorCode_UNKNOWN_PRODUCER_ID:
		return codes.FailedPrecondition
	case runnelv1.ErrorCode_INVALID_TXN_STATE, runnelv1.ErrorCode_INVALID_PRODUCER_ID_MAPPING,
		runnelv1.ErrorCode_PRODUCER_FENCED, runnelv1.ErrorCode_TRANSACTION_COORDINATOR_FENCED:
		return codes.FailedPrecondition
	case runnelv1.ErrorCode_CONCURRENT_TRANSACTIONS, runnelv1.ErrorCode_UNSTABLE_OFFSET_COMMIT:
		return codes.Unavailable
	case runnelv1.ErrorCode_TRANSACTIONAL_ID_NOT_FOUND:
		return codes.NotFound
	case runnelv1.ErrorCode_REQUEST_TIMED_OUT:
		return codes.DeadlineExceeded
	case runnelv1.ErrorCode_MESSAGE_TOO_LARGE, runnelv1.ErrorCode_RECORD_LIST_TOO_LARGE:
		return codes.ResourceExhausted
	case runnelv1.ErrorCode_CORRUPT_MESSAGE:
		return codes.DataLoss
	case runnelv1.ErrorCode_UNSUPPORTED_VERSION, runnelv1.ErrorCode_UNSUPPORTED_FOR_MESSAGE_FORMAT:
		return codes.Unimplemented
	case runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR:
		return codes.Internal
	}
	return codes.InvalidArgument
}

// FromError returns the *Error inside err, or an UNKNOWN_SERVER_ERROR carrying err's text when err holds
// none. It returns nil for a nil err.
func FromError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		if err == error(e) || e.Message == "" {
			return e
		}
		// Keep the wrapping context, which says where it happened, and name the code once: the inner
		// "CODE: message" becomes "message" inside the wrapper's text.
		msg := strings.Replace(err.Error(), e.Error(), e.Message, 1)
		return &Error{Code: e.Code, Message: msg, LeaderID: e.LeaderID, LeaderEpoch: e.LeaderEpoch}
	}
	return &Error{Code: runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR, Message: err.Error(), LeaderID: -1, LeaderEpoch: -1}
}

// ToInfo turns err into the wire detail; nil becomes nil (success). Errors outside the catalogue become
// UNKNOWN_SERVER_ERROR.
func ToInfo(err error) *runnelv1.ErrorInfo {
	e := FromError(err)
	if e == nil {
		return nil
	}
	return &runnelv1.ErrorInfo{Code: e.Code, Message: e.Message, Retriable: Retriable(e.Code),
		LeaderId: e.LeaderID, LeaderEpoch: e.LeaderEpoch}
}

// FromInfo turns a wire detail back into an error; nil or code NONE becomes nil.
func FromInfo(info *runnelv1.ErrorInfo) error {
	if info == nil || info.Code == runnelv1.ErrorCode_NONE {
		return nil
	}
	return &Error{Code: info.Code, Message: info.Message, LeaderID: info.LeaderId, LeaderEpoch: info.LeaderEpoch}
}

// ToStatus turns err into a gRPC status error with an ErrorInfo detail; nil stays nil. An err that is
// already a gRPC status (context cancelled by the transport, say) is returned as it is.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if !errors.As(err, &e) {
		if _, ok := status.FromError(err); ok {
			return err
		}
		if errors.Is(err, errContextCanceled) {
			return status.Error(codes.Canceled, err.Error())
		}
	}
	info := ToInfo(err)
	st := status.New(GRPCCode(info.Code), info.Message)
	if withDetail, derr := st.WithDetails(info); derr == nil {
		st = withDetail
	}
	return st.Err()
}

// FromStatus turns a gRPC status error back into an *Error using its ErrorInfo detail. A status without
// the detail (one made by the transport: unavailable, deadline exceeded, resource exhausted for an
// over-size message) is mapped by its gRPC code, and keeps the status text.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, d := range st.Details() {
		if info, ok := d.(*runnelv1.ErrorInfo); ok {
			return FromInfo(info)
		}
	}
	code := runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR
	switch st.Code() {
	case codes.Unavailable:
		code = runnelv1.ErrorCode_LEADER_NOT_AVAILABLE
	case codes.DeadlineExceeded:
		code = runnelv1.ErrorCode_REQUEST_TIMED_OUT
	case codes.ResourceExhausted:
		code = runnelv1.ErrorCode_RECORD_LIST_TOO_LARGE
	case codes.InvalidArgument:
		code = runnelv1.ErrorCode_INVALID_REQUEST
	case codes.NotFound:
		code = runnelv1.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION
	case codes.Canceled:
		return fmt.Errorf("%s: %w", st.Message(), errContextCanceled)
	}
	return &Error{Code: code, Message: fmt.Sprintf("%s (%s)", st.Message(), st.Code()), LeaderID: -1, LeaderEpoch: -1}
}
