package main

import (
	"errors"
	"fmt"
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
			if c.Host, err = dhchap.ReadSecretFile(h.SecretFile); err != nil {
				errs = append(errs, fmt.Errorf("host %s on %s: %w", h.Host, sub, err))
				continue
			}
			if h.CtrlSecretFile != "" {
				if c.Controller, err = dhchap.ReadSecretFile(h.CtrlSecretFile); err != nil {
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
