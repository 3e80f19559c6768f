package target

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"

	"github.com/nprdma/nprdma/nvme/dhchap"
)

// Hosts added through the management API with a key file
// (HostConfig.DHCHAPKeyFile, and optionally DHCHAPCtrlKeyFile for the
// controller's secret) authenticate with the secrets in them, as hosts
// with secrets in the configuration's Keyring do. The files' paths are
// recorded with the subsystem's host list (never the secrets), read again
// at start and by ReloadHostKeys; a file that cannot be read leaves its
// host unable to authenticate, never admitted without it.

// keyFiles names a host's key files: the host's secret and the
// controller's, with which the target proves itself when the host asks
// (bidirectional authentication; "": none).
type keyFiles struct{ host, ctrl string }

// hostKey is the DH-HMAC-CHAP secrets of a host from its key files.
type hostKey struct {
	files keyFiles
	// secret is the host's, ctrl the controller's (nil: no file named).
	// Both are nil when a file could not be read: the host cannot
	// authenticate.
	secret, ctrl *dhchap.Secret
}

// readHostKey reads a host's key files: both, or an error.
func readHostKey(f keyFiles) (*hostKey, error) {
	secret, err := readKeyFile(f.host)
	if err != nil {
		return nil, err
	}
	k := &hostKey{files: f, secret: secret}
	if f.ctrl != "" {
		if k.ctrl, err = readKeyFile(f.ctrl); err != nil {
			return nil, fmt.Errorf("controller secret: %w", err)
		}
	}
	return k, nil
}

// readKeyFile reads a key file named through the management API: an
// absolute path (the target reads it, wherever the client runs) to a file
// only its owner may read, as for --dhchap-secret-file.
func readKeyFile(path string) (*dhchap.Secret, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("key file %q is not an absolute path (the target reads it)", path)
	}
	return dhchap.ReadSecretFile(path)
}

// credentials are the DH-HMAC-CHAP credentials of host on sub, and whether
// the host must authenticate there: the configuration's keyring first
// (WithKeyring), then the key files of the management API. A host that
// must authenticate may still have no usable credentials (Host nil: a key
// file could not be read), so that every transaction of it fails. A host
// that asks the controller to prove itself (bidirectional) where it has no
// controller secret fails its transaction (nvme/dhchap), whether its
// secret is the keyring's or a key file's. A discovery controller (sub
// nil) never asks.
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
	return dhchap.Credentials{Host: k.secret, Controller: k.ctrl}, true
}

// keyFilesLocked are the key files of the subsystem's hosts, for its
// record (s.mu held).
func (s *Subsystem) keyFilesLocked() map[string]keyFiles {
	if len(s.keys) == 0 {
		return nil
	}
	m := make(map[string]keyFiles, len(s.keys))
	for h, k := range s.keys {
		m[h] = k.files
	}
	return m
}

// hostKeyFiles are the key files a subsystem's record names, by host.
func (rec *subsystemRecord) hostKeyFiles() map[string]keyFiles {
	m := make(map[string]keyFiles, len(rec.HostKeys))
	for host, path := range rec.HostKeys {
		m[host] = keyFiles{host: path, ctrl: rec.HostCtrlKeys[host]}
	}
	return m
}

// setHostKeyFiles records keys (by host) in rec.
func (rec *subsystemRecord) setHostKeyFiles(keys map[string]keyFiles) {
	rec.HostKeys, rec.HostCtrlKeys = nil, nil
	for host, f := range keys {
		if rec.HostKeys == nil {
			rec.HostKeys = map[string]string{}
		}
		rec.HostKeys[host] = f.host
		if f.ctrl != "" {
			if rec.HostCtrlKeys == nil {
				rec.HostCtrlKeys = map[string]string{}
			}
			rec.HostCtrlKeys[host] = f.ctrl
		}
	}
}

// restoreKeys reads the key files a subsystem's record names for its
// hosts (at AddSubsystem). A file that cannot be read is logged: its host
// stays unable to authenticate until the file is fixed and ReloadHostKeys
// reads it.
func (s *Subsystem) restoreKeys(files map[string]keyFiles) {
	for host, f := range files {
		if !s.hosts[host] {
			continue
		}
		k, err := readHostKey(f)
		if err != nil {
			s.t.log.Error("target: a host's DH-HMAC-CHAP key file cannot be read: the host cannot authenticate until it is fixed and the target reloads its keys (SIGHUP)",
				"subsystem", s.nqn, "host", host, "err", err)
			k = &hostKey{files: f}
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
		files := s.keyFilesLocked()
		s.mu.Unlock()
		next := map[string]*hostKey{}
		for host, f := range files {
			k, err := readHostKey(f)
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
		// Only hosts still keyed with the same files: one removed or given
		// other files meanwhile keeps what it has.
		for host, k := range r.keys {
			if old := r.s.keys[host]; old != nil && old.files == k.files {
				r.s.keys[host] = k
				hosts++
			}
		}
		r.s.mu.Unlock()
	}
	return hosts, nil
}

// withKey is keys with host's key files set to k's (nil: removed), for a
// record.
func withKey(keys map[string]keyFiles, host string, k *hostKey) map[string]keyFiles {
	m := maps.Clone(keys)
	if m == nil {
		m = map[string]keyFiles{}
	}
	if k == nil {
		delete(m, host)
	} else {
		m[host] = k.files
	}
	if len(m) == 0 {
		return nil
	}
	return m
}
