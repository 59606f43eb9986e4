package quorum

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Voter is one member of the controller quorum: its node id and the host:port its raft transport is
// reached at.
type Voter struct {
	// ID is the node id (Kafka's node.id), >= 0.
	ID int32
	// Addr is the raft host:port, e.g. "10.0.0.1:7072" or "[::1]:7072".
	Addr string
}

// ParseVoters parses Kafka's controller.quorum.voters form "1@host:port,2@host:port,3@host:port"
// (spaces around entries are ignored). It returns the voters in the given order. It errors for empty
// input, an entry without "id@host:port", an id that is not a non-negative 32-bit integer, an address
// without a host or a port in 1-65535, duplicate ids or addresses, and counts other than 1, 3 or 5: a
// commit needs a majority of voters, so a quorum of 2 or 4 tolerates no more failures than one of 1 or 3
// (the Raft paper, §5.1), and more than 5 voters only slow commits down (Kafka's KRaft operations
// guide likewise suggests 3 or 5 controllers).
func ParseVoters(s string) ([]Voter, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("controller quorum voters: empty (want id@host:port,...)")
	}
	var voters []Voter
	for _, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		idStr, addr, ok := strings.Cut(entry, "@")
		if !ok {
			return nil, fmt.Errorf("controller quorum voter %q: want id@host:port", entry)
		}
		id, err := strconv.ParseInt(idStr, 10, 32)
		if err != nil || id < 0 {
			return nil, fmt.Errorf("controller quorum voter %q: id %q is not a node id (0 to 2147483647)", entry, idStr)
		}
		voters = append(voters, Voter{ID: int32(id), Addr: addr})
	}
	if err := validateVoters(voters); err != nil {
		return nil, err
	}
	return voters, nil
}

// FormatVoters is the inverse of ParseVoters: "1@host:port,2@host:port" in the order of v.
func FormatVoters(v []Voter) string {
	var b strings.Builder
	for i, voter := range v {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(int64(voter.ID), 10))
		b.WriteByte('@')
		b.WriteString(voter.Addr)
	}
	return b.String()
}

// validateVoters checks what ParseVoters promises about its result.
func validateVoters(voters []Voter) error {
	switch len(voters) {
	case 1, 3, 5:
	default:
		return fmt.Errorf("controller quorum voters: %d voters, want 1, 3 or 5 (an even count tolerates no more failures than one voter fewer)",
			len(voters))
	}
	ids := make(map[int32]bool, len(voters))
	addrs := make(map[string]bool, len(voters))
	for _, v := range voters {
		if v.ID < 0 {
			return fmt.Errorf("controller quorum voter %d: negative id", v.ID)
		}
		if err := checkHostPort(v.Addr); err != nil {
			return fmt.Errorf("controller quorum voter %d: %w", v.ID, err)
		}
		if ids[v.ID] {
			return fmt.Errorf("controller quorum voters: id %d appears twice", v.ID)
		}
		if addrs[v.Addr] {
			return fmt.Errorf("controller quorum voters: address %s appears twice", v.Addr)
		}
		ids[v.ID], addrs[v.Addr] = true, true
	}
	return nil
}

// checkHostPort checks that addr is host:port with a non-empty host and a port in 1-65535.
func checkHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	if host == "" {
		return fmt.Errorf("address %q: no host", addr)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return fmt.Errorf("address %q: port %q is not in 1-65535", addr, port)
	}
	return nil
}
