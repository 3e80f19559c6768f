package nvme

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf8"
)

// DiscoveryNQN is the well-known NQN of discovery controllers.
const DiscoveryNQN = "nqn.2014-08.org.nvmexpress.discovery"

// MaxNQNLength is the longest valid NQN in bytes.
const MaxNQNLength = 223

const uuidNQNPrefix = "nqn.2014-08.org.nvmexpress:uuid:"

// ValidateNQN checks an NVMe Qualified Name: at most 223 bytes of UTF-8 and
// one of
//
//   - the discovery NQN;
//   - "nqn.2014-08.org.nvmexpress:uuid:" followed by a UUID
//     (8-4-4-4-12 hex digits);
//   - "nqn.YYYY-MM." + a reverse domain name + ":" + a non-empty string.
func ValidateNQN(nqn string) error {
	if len(nqn) > MaxNQNLength {
		return fmt.Errorf("nvme: NQN %.40q... is %d bytes, at most %d", nqn, len(nqn), MaxNQNLength)
	}
	if !utf8.ValidString(nqn) {
		return fmt.Errorf("nvme: NQN %q is not valid UTF-8", nqn)
	}
	for i, r := range nqn {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("nvme: NQN %q has a control character at byte %d", nqn, i)
		}
	}
	if nqn == DiscoveryNQN {
		return nil
	}
	if rest, ok := strings.CutPrefix(nqn, uuidNQNPrefix); ok {
		if _, err := ParseUUID(rest); err != nil {
			return fmt.Errorf("nvme: NQN %q: %w", nqn, err)
		}
		return nil
	}
	rest, ok := strings.CutPrefix(nqn, "nqn.")
	if !ok {
		return fmt.Errorf("nvme: NQN %q does not start with \"nqn.\"", nqn)
	}
	if len(rest) < 8 || !digits(rest[0:4]) || rest[4] != '-' || !digits(rest[5:7]) || rest[7] != '.' {
		return fmt.Errorf("nvme: NQN %q: want a date \"nqn.YYYY-MM.\"", nqn)
	}
	if month := (rest[5]-'0')*10 + rest[6] - '0'; month < 1 || month > 12 {
		return fmt.Errorf("nvme: NQN %q: month %s is not 01-12", nqn, rest[5:7])
	}
	domain, name, ok := strings.Cut(rest[8:], ":")
	if !ok || name == "" {
		return fmt.Errorf("nvme: NQN %q: want a reverse domain name, then \":\" and a name", nqn)
	}
	for _, label := range strings.Split(domain, ".") {
		if err := checkLabel(label); err != nil {
			return fmt.Errorf("nvme: NQN %q: reverse domain %q: %w", nqn, domain, err)
		}
	}
	return nil
}

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func checkLabel(label string) error {
	if label == "" || len(label) > 63 {
		return fmt.Errorf("label %q must be 1-63 characters", label)
	}
	for i := 0; i < len(label); i++ {
		c := label[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' || i == 0 || i == len(label)-1) {
			return fmt.Errorf("label %q: letters, digits and inner hyphens only", label)
		}
	}
	return nil
}

// UUID is a 16-byte UUID (host identifier, namespace UUID).
type UUID [16]byte

// NewUUID returns a random (version 4) UUID.
func NewUUID() UUID {
	var u UUID
	_, _ = rand.Read(u[:]) // crypto/rand.Read never fails
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return u
}

// String is the 8-4-4-4-12 lower-case form.
func (u UUID) String() string {
	h := hex.EncodeToString(u[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// ParseUUID parses the 8-4-4-4-12 hex form (either case).
func ParseUUID(s string) (UUID, error) {
	var u UUID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, fmt.Errorf("UUID %q: want 8-4-4-4-12 hex digits", s)
	}
	h := s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:36]
	if _, err := hex.Decode(u[:], []byte(h)); err != nil {
		return UUID{}, fmt.Errorf("UUID %q: %w", s, err)
	}
	return u, nil
}

// HostNQNFromUUID is the host NQN derived from a host UUID,
// "nqn.2014-08.org.nvmexpress:uuid:<uuid>", as nvme-cli generates it.
func HostNQNFromUUID(u UUID) string { return uuidNQNPrefix + u.String() }

// UUIDFromNQN returns the UUID of a UUID-form NQN.
func UUIDFromNQN(nqn string) (UUID, bool) {
	rest, ok := strings.CutPrefix(nqn, uuidNQNPrefix)
	if !ok {
		return UUID{}, false
	}
	u, err := ParseUUID(rest)
	return u, err == nil
}
