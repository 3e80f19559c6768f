package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"

	"github.com/nprdma/nprdma/nvme/dhchap"
)

// hostSecretSpec names the key files of one host on a subsystem: its
// secret and, optionally, the controller's secret for bidirectional
// authentication. Each file holds one secret in the DHHC-1 textual form
// (nprdma-target gen-dhchap-key writes one).
type hostSecretSpec struct {
	Host           string `json:"host"`
	SecretFile     string `json:"secret_file"`
	CtrlSecretFile string `json:"ctrl_secret_file"`
}

// maxKeyFile bounds what is read of a key file (a secret is under 100
// bytes).
const maxKeyFile = 4096

// readSecretFile reads a secret from a file that only its owner may read
// or write: a key file open to group or others is refused, as ssh refuses
// a private key. The error never quotes the file's content.
func readSecretFile(path string) (*dhchap.Secret, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("key file %s is not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("key file %s is open to group or others (mode %04o): make it owner-only (chmod 600)", path, perm)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxKeyFile {
		return nil, fmt.Errorf("key file %s is larger than a secret (%d bytes or more)", path, maxKeyFile)
	}
	s, err := dhchap.ParseSecret(string(b))
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	return s, nil
}

// fileKeyring is the target's Keyring over key files: read at start, and
// read again by Reload (SIGHUP), which replaces every secret at once or,
// if any file cannot be read, none.
type fileKeyring struct {
	specs map[string][]hostSecretSpec // by subsystem NQN
	cur   atomic.Pointer[map[[2]string]dhchap.Credentials]
}

func newFileKeyring(specs map[string][]hostSecretSpec) (*fileKeyring, error) {
	k := &fileKeyring{specs: specs}
	if err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// Reload reads every key file; on an error the secrets in force stay.
func (k *fileKeyring) Reload() error {
	next := map[[2]string]dhchap.Credentials{}
	var errs []error
	for sub, hosts := range k.specs {
		for _, h := range hosts {
			var c dhchap.Credentials
			var err error
			if c.Host, err = readSecretFile(h.SecretFile); err != nil {
				errs = append(errs, fmt.Errorf("host %s on %s: %w", h.Host, sub, err))
				continue
			}
			if h.CtrlSecretFile != "" {
				if c.Controller, err = readSecretFile(h.CtrlSecretFile); err != nil {
					errs = append(errs, fmt.Errorf("host %s on %s: controller secret: %w", h.Host, sub, err))
					continue
				}
			}
			next[[2]string{sub, h.Host}] = c
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	k.cur.Store(&next)
	return nil
}

// Hosts is how many hosts have secrets.
func (k *fileKeyring) Hosts() int { return len(*k.cur.Load()) }

// DHCHAP implements target.Keyring.
func (k *fileKeyring) DHCHAP(sub, host string) (dhchap.Credentials, bool) {
	c, ok := (*k.cur.Load())[[2]string{sub, host}]
	return c, ok
}

// parseHostFiles reads --dhchap-secret-file / --dhchap-ctrl-secret-file
// values, NQN=PATH, into specs for one subsystem.
func parseHostFiles(secrets, ctrlSecrets []string) ([]hostSecretSpec, error) {
	var specs []hostSecretSpec
	index := map[string]int{}
	for _, v := range secrets {
		host, path, ok := strings.Cut(v, "=")
		if !ok || host == "" || path == "" {
			return nil, fmt.Errorf("--dhchap-secret-file %q: want HOSTNQN=PATH", v)
		}
		if _, dup := index[host]; dup {
			return nil, fmt.Errorf("--dhchap-secret-file: host %s given twice", host)
		}
		index[host] = len(specs)
		specs = append(specs, hostSecretSpec{Host: host, SecretFile: path})
	}
	for _, v := range ctrlSecrets {
		host, path, ok := strings.Cut(v, "=")
		if !ok || host == "" || path == "" {
			return nil, fmt.Errorf("--dhchap-ctrl-secret-file %q: want HOSTNQN=PATH", v)
		}
		i, ok := index[host]
		if !ok {
			return nil, fmt.Errorf("--dhchap-ctrl-secret-file: host %s has no --dhchap-secret-file (the host authenticates first)", host)
		}
		specs[i].CtrlSecretFile = path
	}
	return specs, nil
}
