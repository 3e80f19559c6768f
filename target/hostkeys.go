package target

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"

	"github.com/nprdma/nprdma/nvme/dhchap"
)

// Hosts added through the management API with a key file
// (HostConfig.DHCHAPKeyFile) authenticate with the secret in it, as hosts
// with a secret in the configuration's Keyring do. The file's path is
// recorded with the subsystem's host list (never the secret), read again
// at start and by ReloadHostKeys; a file that cannot be read leaves its
// host unable to authenticate, never admitted without it.

// hostKey is the DH-HMAC-CHAP secret of a host from a key file.
type hostKey struct {
	path   string
	secret *dhchap.Secret // nil: the file could not be read (the host cannot authenticate)
}

// readHostKey reads a key file named through the management API: an
// absolute path (the target reads it, wherever the client runs) to a file
// only its owner may read, as for --dhchap-secret-file.
func readHostKey(path string) (*hostKey, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("key file %q is not an absolute path (the target reads it)", path)
	}
	s, err := dhchap.ReadSecretFile(path)
	if err != nil {
		return nil, err
	}
	return &hostKey{path: path, secret: s}, nil
}

// credentials are the DH-HMAC-CHAP credentials of host on sub, and whether
// the host must authenticate there: the configuration's keyring first
// (WithKeyring), then the key files of the management API. A host that
// must authenticate may still have no usable credentials (Host nil: its key
// file could not be read), so that every transaction of it fails. A
// discovery controller (sub nil) never asks.
func (t *Target) credentials(sub *Subsystem, host string) (dhchap.Credentials, bool) {
	if sub == nil {
		return dhchap.Credentials{}, false
	}
	if t.cfg.keyring != nil {
		if c, ok := t.cfg.keyring.DHCHAP(sub.nqn, host); ok {
			return c, true
		}
	}
	sub.mu.Lock()
	defer sub.mu.Unlock()
	k := sub.keys[host]
	if k == nil {
		return dhchap.Credentials{}, false
	}
	return dhchap.Credentials{Host: k.secret}, true
}

// keyPaths are the key files of the subsystem's hosts, for its record
// (s.mu held).
func (s *Subsystem) keyPathsLocked() map[string]string {
	if len(s.keys) == 0 {
		return nil
	}
	m := make(map[string]string, len(s.keys))
	for h, k := range s.keys {
		m[h] = k.path
	}
	return m
}

// restoreKeys reads the key files a subsystem's record names for its
// hosts (at AddSubsystem). A file that cannot be read is logged: its host
// stays unable to authenticate until the file is fixed and ReloadHostKeys
// reads it.
func (s *Subsystem) restoreKeys(paths map[string]string) {
	for host, path := range paths {
		if !s.hosts[host] {
			continue
		}
		k, err := readHostKey(path)
		if err != nil {
			s.t.log.Error("target: a host's DH-HMAC-CHAP key file cannot be read: the host cannot authenticate until it is fixed and the target reloads its keys (SIGHUP)",
				"subsystem", s.nqn, "host", host, "err", err)
			k = &hostKey{path: path}
		}
		s.keys[host] = k
	}
}

// ReloadHostKeys reads again the key files of the hosts added through the
// management API: new queues and re-authentications use the secrets read.
// If any file cannot be read none is replaced, and the error says which.
func (t *Target) ReloadHostKeys() (hosts int, err error) {
	type read struct {
		s    *Subsystem
		keys map[string]*hostKey
	}
	var all []read
	var errs []error
	for _, s := range t.Subsystems() {
		s.mu.Lock()
		paths := s.keyPathsLocked()
		s.mu.Unlock()
		next := map[string]*hostKey{}
		for host, path := range paths {
			k, err := readHostKey(path)
			if err != nil {
				errs = append(errs, fmt.Errorf("host %s on %s: %w", host, s.nqn, err))
				continue
			}
			next[host] = k
		}
		all = append(all, read{s, next})
	}
	if err := errors.Join(errs...); err != nil {
		return 0, fmt.Errorf("target: DH-HMAC-CHAP key files: %w", err)
	}
	for _, r := range all {
		r.s.mu.Lock()
		// Only hosts still keyed: one removed meanwhile stays removed.
		for host, k := range r.keys {
			if old := r.s.keys[host]; old != nil && old.path == k.path {
				r.s.keys[host] = k
				hosts++
			}
		}
		r.s.mu.Unlock()
	}
	return hosts, nil
}

// withKey is keys with host's key set to k (nil: removed), for a record.
func withKey(keys map[string]string, host string, k *hostKey) map[string]string {
	m := maps.Clone(keys)
	if m == nil {
		m = map[string]string{}
	}
	if k == nil {
		delete(m, host)
	} else {
		m[host] = k.path
	}
	if len(m) == 0 {
		return nil
	}
	return m
}
