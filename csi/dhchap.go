package csi

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nprdma/nprdma/nvme/dhchap"
)

// A node authenticates to targets that require DH-HMAC-CHAP with the
// secrets of its NodeStageVolume request (Kubernetes fills them from the
// Secret the StorageClass names in csi.storage.k8s.io/node-stage-secret-name
// and -namespace). The keys are named after nvme-cli's options; other keys
// of the Secret are ignored.
const (
	secretDHCHAP     = "dhchapSecret"     // this node's host secret, DHHC-1:hh:...:
	secretDHCHAPCtrl = "dhchapCtrlSecret" // the controller's secret: bidirectional authentication
)

// stageSecrets are the DH-HMAC-CHAP secrets of a NodeStageVolume request
// (nil: not given).
type stageSecrets struct {
	host, ctrl *dhchap.Secret
}

// parseStageSecrets reads the secrets of a NodeStageVolume request. A
// malformed secret, or a controller secret without the host's, is
// InvalidArgument; the message names the key, never the value.
func parseStageSecrets(m map[string]string) (stageSecrets, error) {
	var s stageSecrets
	for _, k := range []struct {
		key string
		dst **dhchap.Secret
	}{{secretDHCHAP, &s.host}, {secretDHCHAPCtrl, &s.ctrl}} {
		v, ok := m[k.key]
		if !ok {
			continue
		}
		sec, err := dhchap.ParseSecret(v)
		if err != nil {
			return s, status.Errorf(codes.InvalidArgument, "node-stage secret %s: %v", k.key, err)
		}
		*k.dst = sec
	}
	if s.ctrl != nil && s.host == nil {
		return s, status.Errorf(codes.InvalidArgument, "node-stage secret %s needs %s too: DH-HMAC-CHAP authenticates the host first", secretDHCHAPCtrl, secretDHCHAP)
	}
	return s, nil
}

// secretsDir is where the node writes the secrets nprdma-initiator reads:
// RUN-DIR/csi-secrets, mode 0700.
func (d *Driver) secretsDir() string { return filepath.Join(d.cfg.runDir, "csi-secrets") }

// writeSecretFiles hands s to nprdma-initiator: each secret in a file of
// mode 0600 in a directory of its own under secretsDir, never on a command
// line or in an environment other users can read. It returns the
// arguments naming the files and what removes them, which the caller does
// as soon as attach returns: the attach process reads the files once, at
// start, and authenticates its reconnects with what it read
// (docs/kubernetes.md).
func (d *Driver) writeSecretFiles(name string, s stageSecrets) (args []string, remove func(), err error) {
	if s.host == nil {
		return nil, func() {}, nil
	}
	root := d.secretsDir()
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, nil, err
	}
	if st, err := os.Lstat(root); err != nil {
		return nil, nil, err
	} else if !st.IsDir() {
		return nil, nil, fmt.Errorf("%s is not a directory", root)
	}
	if err := os.Chmod(root, 0o700); err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp(root, name+"-")
	if err != nil {
		return nil, nil, err
	}
	remove = func() {
		if err := os.RemoveAll(dir); err != nil {
			d.cfg.log.Error("csi: removing the DH-HMAC-CHAP secret files", "dir", dir, "err", err)
		}
	}
	for _, f := range []struct {
		flag, file string
		secret     *dhchap.Secret
	}{{"--dhchap-secret-file", "host", s.host}, {"--dhchap-ctrl-secret-file", "ctrl", s.ctrl}} {
		if f.secret == nil {
			continue
		}
		path := filepath.Join(dir, f.file)
		if err := writeOwnerOnly(path, f.secret.Encode()+"\n"); err != nil {
			remove()
			return nil, nil, err
		}
		args = append(args, f.flag, path)
	}
	return args, remove, nil
}

// writeOwnerOnly writes a new file of mode 0600.
func writeOwnerOnly(path, content string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(content)
	return errors.Join(err, f.Close())
}

// refusals are what nprdma-initiator says when authentication fails in a
// way only other secrets can cure (initiator/auth.go): the target refused
// the host's secret, required one and none was given, or did not prove it
// holds the controller secret.
var refusals = []string{
	"DH-HMAC-CHAP secret on queue",                                 // ... refused host H's DH-HMAC-CHAP secret on queue N
	"requires DH-HMAC-CHAP authentication and no secret was given", // initiator.ErrAuthenticationRequired
	"did not prove it holds the controller secret",
	"cannot authenticate (a controller secret was given",
}

// attachError is the status of a failed attach: Unauthenticated where the
// target refused the node's secrets (or required some, or did not prove
// itself), which the CSI spec gives to an RPC whose secrets are not valid
// for authentication; Internal otherwise.
func attachError(v volume, err error) error {
	for _, r := range refusals {
		if strings.Contains(err.Error(), r) {
			return status.Errorf(codes.Unauthenticated, "volume %s: DH-HMAC-CHAP authentication with the target failed (the node-stage secrets %s and %s): %v",
				v.id(), secretDHCHAP, secretDHCHAPCtrl, err)
		}
	}
	return status.Errorf(codes.Internal, "volume %s: %v", v.id(), err)
}
