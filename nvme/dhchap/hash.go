package dhchap

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/sha512"
	"fmt"
	"hash"
)

// HashID identifies a hash function (the HashID of DH-HMAC-CHAP and the
// hh of a secret's textual form).
type HashID uint8

// Hash functions. HashNone is valid only in a secret: its key is used
// as it is, without the transformation.
const (
	HashNone   HashID = 0
	HashSHA256 HashID = 1
	HashSHA384 HashID = 2
	HashSHA512 HashID = 3
)

// DefaultHashes is the preference order a controller chooses from and the
// list a host offers: every hash this package knows.
var DefaultHashes = []HashID{HashSHA256, HashSHA384, HashSHA512}

// Size is the digest length in bytes (0 for HashNone and unknown IDs).
func (h HashID) Size() int {
	switch h {
	case HashSHA256:
		return 32
	case HashSHA384:
		return 48
	case HashSHA512:
		return 64
	}
	return 0
}

// Valid reports whether h is a hash function (not HashNone).
func (h HashID) Valid() bool { return h.Size() != 0 }

func (h HashID) newHash() func() hash.Hash {
	switch h {
	case HashSHA256:
		return sha256.New
	case HashSHA384:
		return sha512.New384
	case HashSHA512:
		return sha512.New
	}
	panic(fmt.Sprintf("dhchap: hash %d has no function", h))
}

// String is the name Linux uses ("hmac(sha256)").
func (h HashID) String() string {
	switch h {
	case HashNone:
		return "none"
	case HashSHA256:
		return "hmac(sha256)"
	case HashSHA384:
		return "hmac(sha384)"
	case HashSHA512:
		return "hmac(sha512)"
	}
	return fmt.Sprintf("hash 0x%02x", uint8(h))
}

// mac returns the HMAC of the parts under key with hash h.
func (h HashID) mac(key []byte, parts ...[]byte) []byte {
	m := hmac.New(h.newHash(), key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// digest returns the hash of b.
func (h HashID) digest(b []byte) []byte {
	d := h.newHash()()
	d.Write(b)
	return d.Sum(nil)
}
