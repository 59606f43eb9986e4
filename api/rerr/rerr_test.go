package rerr

import (
	"context"
	"errors"
	"fmt"
	"testing"

	runnelv1 "github.com/runnel-io/runnel/api/runnel/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestStatusRoundTrip(t *testing.T) {
	err := fmt.Errorf("read t-0: %w", New(runnelv1.ErrorCode_OFFSET_OUT_OF_RANGE, "offset 9 outside [0, 5]"))
	st := ToStatus(err)
	if status.Code(st) != codes.OutOfRange {
		t.Fatalf("code %v", status.Code(st))
	}
	back := FromStatus(st)
	if !errors.Is(back, ErrOffsetOutOfRange) || errors.Is(back, ErrCorruptMessage) {
		t.Fatalf("round trip: %v", back)
	}
	if got := ToInfo(New(runnelv1.ErrorCode_INVALID_CONFIG, "bad")).Message; got != "bad" {
		t.Fatalf("an unwrapped error's message gained its code: %q", got)
	}
	if got := back.Error(); got != "OFFSET_OUT_OF_RANGE: read t-0: offset 9 outside [0, 5]" {
		t.Fatalf("message kept context? %q", got)
	}
}

func TestFromStatusWithoutDetail(t *testing.T) {
	for c, want := range map[codes.Code]error{
		codes.Unavailable:       ErrLeaderNotAvailable,
		codes.ResourceExhausted: ErrRecordListTooLarge,
		codes.DeadlineExceeded:  ErrRequestTimedOut,
	} {
		if got := FromStatus(status.Error(c, "x")); !errors.Is(got, want) {
			t.Errorf("%v -> %v, want %v", c, got, want)
		}
	}
	if got := FromStatus(status.Error(codes.Canceled, "x")); !errors.Is(got, context.Canceled) {
		t.Errorf("canceled -> %v", got)
	}
}

func TestInfoAndRetriable(t *testing.T) {
	if ToInfo(nil) != nil || FromInfo(nil) != nil || FromInfo(&runnelv1.ErrorInfo{}) != nil {
		t.Fatal("nil/NONE must mean success")
	}
	info := ToInfo(errors.New("disk on fire"))
	if info.Code != runnelv1.ErrorCode_UNKNOWN_SERVER_ERROR || info.Message != "disk on fire" {
		t.Fatalf("foreign error: %v", info)
	}
	if !Retriable(runnelv1.ErrorCode_NOT_LEADER_OR_FOLLOWER) || Retriable(runnelv1.ErrorCode_MESSAGE_TOO_LARGE) {
		t.Fatal("retriable flags")
	}
	if !ToInfo(ErrRequestTimedOut).Retriable {
		t.Fatal("detail must carry the retriable flag")
	}
}

// The idempotent producer's sequence errors are final, as in Kafka, and travel as FailedPrecondition.
func TestProducerSequenceErrors(t *testing.T) {
	for _, e := range []*Error{ErrOutOfOrderSequence, ErrDuplicateSequence, ErrInvalidProducerEpoch, ErrUnknownProducerID} {
		if e.Retriable() || ToInfo(e).Retriable {
			t.Errorf("%v is retriable", e.Code)
		}
		st := ToStatus(fmt.Errorf("t-0: %w", New(e.Code, "x")))
		if status.Code(st) != codes.FailedPrecondition {
			t.Errorf("%v travels as %v", e.Code, status.Code(st))
		}
		if back := FromStatus(st); !errors.Is(back, e) {
			t.Errorf("%v came back as %v", e.Code, back)
		}
	}
}
