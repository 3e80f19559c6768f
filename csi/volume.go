package csi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
)

// A volume is namespace 1 of a subsystem of its own on one target, so that
// publishing it to a node lets that node's host into this volume only. Its
// ID is TARGET/KEY, where KEY is derived from the volume's name (the CO's
// name for it, which makes CreateVolume idempotent): the first 20 hex
// digits of its SHA-256. The subsystem is SubsystemPrefix + KEY and the
// namespace is named "csi-" + KEY (and its backing file so).

// SubsystemPrefix begins the NQN of every subsystem the driver creates.
const SubsystemPrefix = "nqn.2024-01.io.nprdma:csi-"

// volumeNSID is the NSID of a volume's namespace in its subsystem.
const volumeNSID = 1

var nameRule = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

type volume struct {
	target string
	key    string
}

func volumeFor(target, name string) volume {
	sum := sha256.Sum256([]byte(name))
	return volume{target: target, key: hex.EncodeToString(sum[:])[:20]}
}

func (v volume) id() string         { return v.target + "/" + v.key }
func (v volume) nqn() string        { return SubsystemPrefix + v.key }
func (v volume) nsName() string     { return "csi-" + v.key }
func (v volume) attachName() string { return "csi-" + v.key }

// parseVolumeID reads TARGET/KEY.
func parseVolumeID(id string) (volume, error) {
	target, key, ok := strings.Cut(id, "/")
	if !ok || !nameRule.MatchString(target) || len(key) != 20 || strings.Trim(key, "0123456789abcdef") != "" {
		return volume{}, fmt.Errorf("volume ID %q is not TARGET/KEY (20 hex digits)", id)
	}
	return volume{target: target, key: key}, nil
}

// keyOfNQN is the key of a subsystem the driver created, or "".
func keyOfNQN(nqn string) string {
	k, ok := strings.CutPrefix(nqn, SubsystemPrefix)
	if !ok {
		return ""
	}
	return k
}
