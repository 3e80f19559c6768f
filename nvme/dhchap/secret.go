package dhchap

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"strings"
)

// ErrBadSecret: a secret's textual form is malformed (the message never
// quotes the secret).
var ErrBadSecret = errors.New("dhchap: malformed secret")

// secretPrefix starts the textual form of a secret: "DHHC-1:hh:" with hh
// the hash function, then base64 of the key and its CRC-32, then ":".
const secretPrefix = "DHHC-1:"

// Secret is a DH-HMAC-CHAP secret: a key of 32, 48 or 64 bytes and the hash
// function its users apply to it with their NQN (the transformation).
//
// It never prints its key: String, GoString, Format and LogValue show only
// "DHHC-1:hh:<redacted>". Encode is the only way to get the textual form
// back, for writing a key file.
type Secret struct {
	key  []byte
	hash HashID
}

// KeyLengths are the key lengths a secret may have.
var KeyLengths = []int{32, 48, 64}

func validKeyLength(n int) bool { return n == 32 || n == 48 || n == 64 }

// NewSecret makes a secret of key (copied) for hash function h (HashNone:
// the key is used without transformation).
func NewSecret(key []byte, h HashID) (*Secret, error) {
	if h != HashNone && !h.Valid() {
		return nil, fmt.Errorf("%w: hash function %d (want 0 to 3)", ErrBadSecret, h)
	}
	if !validKeyLength(len(key)) {
		return nil, fmt.Errorf("%w: key of %d bytes (want 32, 48 or 64)", ErrBadSecret, len(key))
	}
	return &Secret{key: append([]byte(nil), key...), hash: h}, nil
}

// GenerateSecret draws a key of keyLen bytes (32, 48 or 64; 0 picks the
// digest length of h, 32 for HashNone) from r (nil: crypto/rand).
func GenerateSecret(h HashID, keyLen int, r io.Reader) (*Secret, error) {
	if keyLen == 0 {
		keyLen = max(h.Size(), 32)
	}
	if !validKeyLength(keyLen) {
		return nil, fmt.Errorf("%w: key length %d (want 32, 48 or 64)", ErrBadSecret, keyLen)
	}
	if r == nil {
		r = rand.Reader
	}
	key := make([]byte, keyLen)
	if _, err := io.ReadFull(r, key); err != nil {
		return nil, fmt.Errorf("dhchap: drawing a key: %w", err)
	}
	return NewSecret(key, h)
}

// ParseSecret reads the textual form "DHHC-1:hh:<base64 of key and
// CRC-32>:". Surrounding white space (a key file's newline) is ignored and
// the final colon is optional, as Linux reads it. The CRC-32 (IEEE, little
// endian) must match the key.
func ParseSecret(s string) (*Secret, error) {
	s = strings.TrimSpace(s)
	rest, ok := strings.CutPrefix(s, secretPrefix)
	if !ok {
		return nil, fmt.Errorf("%w: does not start with %q", ErrBadSecret, secretPrefix)
	}
	hh, b64, ok := strings.Cut(rest, ":")
	if !ok || len(hh) != 2 || hh[0] != '0' || hh[1] < '0' || hh[1] > '3' {
		return nil, fmt.Errorf("%w: the hash field after %q must be 00, 01, 02 or 03", ErrBadSecret, secretPrefix)
	}
	b64 = strings.TrimSuffix(b64, ":")
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("%w: the key is not base64", ErrBadSecret)
	}
	if !validKeyLength(len(raw) - 4) {
		return nil, fmt.Errorf("%w: %d bytes of key and CRC (want 36, 52 or 68)", ErrBadSecret, len(raw))
	}
	key, sum := raw[:len(raw)-4], binary.LittleEndian.Uint32(raw[len(raw)-4:])
	if crc32.ChecksumIEEE(key) != sum {
		return nil, fmt.Errorf("%w: the CRC does not match the key (a character changed?)", ErrBadSecret)
	}
	return NewSecret(key, HashID(hh[1]-'0'))
}

// Encode returns the textual form, "DHHC-1:hh:<base64>:". It is the secret
// itself: write it only where the secret belongs (a key file of mode 0600).
func (s *Secret) Encode() string {
	raw := binary.LittleEndian.AppendUint32(append([]byte(nil), s.key...), crc32.ChecksumIEEE(s.key))
	return fmt.Sprintf("%s%02d:%s:", secretPrefix, s.hash, base64.StdEncoding.EncodeToString(raw))
}

// Hash is the hash function of the transformation (HashNone: none).
func (s *Secret) Hash() HashID { return s.hash }

// KeyLen is the key's length in bytes.
func (s *Secret) KeyLen() int { return len(s.key) }

// Equal reports whether s and o are the same secret.
func (s *Secret) Equal(o *Secret) bool {
	if s == nil || o == nil {
		return s == o
	}
	return s.hash == o.hash && string(s.key) == string(o.key)
}

// Transform is the key a party computes its responses with: the key
// itself for HashNone, else HMAC(key, NQN || "NVMe-over-Fabrics") with the
// secret's hash function, where NQN is the host NQN for a host secret and
// the subsystem NQN for a controller secret.
func (s *Secret) Transform(nqn string) []byte {
	if s.hash == HashNone {
		return append([]byte(nil), s.key...)
	}
	return s.hash.mac(s.key, []byte(nqn), []byte("NVMe-over-Fabrics"))
}

// String never shows the key.
func (s *Secret) String() string {
	if s == nil {
		return "<no secret>"
	}
	return fmt.Sprintf("%s%02d:<redacted>", secretPrefix, s.hash)
}

// GoString never shows the key (%#v).
func (s *Secret) GoString() string { return s.String() }

// Format never shows the key, whatever the verb.
func (s *Secret) Format(f fmt.State, _ rune) { io.WriteString(f, s.String()) }

// LogValue never shows the key (log/slog).
func (s *Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }
