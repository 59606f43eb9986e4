package quorum

import (
	"errors"
	"fmt"
	"strconv"
)

// Errors callers branch on (with errors.Is; they always come wrapped with context).
var (
	// ErrNotLeader: the call needs the controller leader and this node is not it. It is returned wrapped
	// in a *NotLeaderError that says who leads, when known, so the caller can forward the request there
	// (as KRaft answers NOT_CONTROLLER with the current controller).
	ErrNotLeader = errors.New("not the controller leader")
	// ErrShutdown: the Quorum was closed.
	ErrShutdown = errors.New("quorum shut down")
	// ErrNoQuorum: a write could not commit within its context because no majority of voters was
	// reachable — the leader could not replicate it, or no leader could be elected while it waited.
	// Propose returns it wrapped (together with the context's error) when its context ends while this
	// node leads, or while no leader is known. The entry may still commit later if it reached a
	// follower: treat the outcome as unknown.
	ErrNoQuorum = errors.New("no controller quorum: write not committed in time")
)

// NotLeaderError says who leads the quorum, when known: LeaderID -1 and LeaderAddr "" when unknown.
// errors.Is(err, ErrNotLeader) is true for it.
type NotLeaderError struct {
	// LeaderID is the node id of the current leader, -1 when unknown.
	LeaderID int32
	// LeaderAddr is the raft host:port of the current leader, "" when unknown.
	LeaderAddr string
}

// Error says who leads: "not the controller leader (leader is 2 at 10.0.0.2:7072)".
func (e *NotLeaderError) Error() string {
	if e.LeaderID < 0 {
		return ErrNotLeader.Error() + " (leader unknown)"
	}
	return ErrNotLeader.Error() + " (leader is " + strconv.FormatInt(int64(e.LeaderID), 10) + " at " + e.LeaderAddr + ")"
}

// Unwrap returns ErrNotLeader.
func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }

// noQuorum is the error for a context that ended before an entry was committed and applied.
func noQuorum(ctxErr error, what string) error {
	return fmt.Errorf("quorum: %s: %w: %w", what, ErrNoQuorum, ctxErr)
}
