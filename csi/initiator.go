package csi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// The node service attaches volumes with the nprdma-initiator binary
// (attach --daemon --mode fuse), not the initiator library in-process: each
// attachment is its own process, so that a failing one takes neither the
// others nor the plugin's gRPC server down, and its record in the run
// directory is what makes NodeStage and NodeUnstage idempotent and lets a
// restarted plugin find (and tear down) what the one before attached. It
// also keeps the node service on the CLI's contract rather than on the
// initiator's Go API (docs/kubernetes.md).

// attachment is the part of an attach record (nprdma-initiator list --json)
// the node reads.
type attachment struct {
	Name       string `json:"name"`
	State      string `json:"state"`
	Target     string `json:"target"`
	NQN        string `json:"nqn"`
	NSID       uint32 `json:"nsid"`
	Size       int64  `json:"size_bytes"`
	LoopDevice string `json:"loop_device"`
	// Device is the block device in records that name it so for every
	// block-device mode; LoopDevice is then set from it (decode).
	Device     string `json:"device"`
	LostReason string `json:"lost_reason"`
}

// decode reads attach records (one, or a list), with LoopDevice set
// whichever name the record gives the device.
func decode(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		return err
	}
	fix := func(a *attachment) {
		if a.LoopDevice == "" {
			a.LoopDevice = a.Device
		}
	}
	switch v := v.(type) {
	case *attachment:
		fix(v)
	case *[]attachment:
		for i := range *v {
			fix(&(*v)[i])
		}
	}
	return nil
}

// initiator runs nprdma-initiator with the node's global arguments and
// returns its standard output; a failure carries its standard error.
func (d *Driver) initiator(ctx context.Context, args ...string) ([]byte, error) {
	all := append(append([]string{"--hostnqn", d.cfg.hostNQN}, d.cfg.initArgs...), args...)
	cmd := exec.CommandContext(ctx, d.cfg.initiator, all...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("nprdma-initiator %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// attachmentNamed is the attachment called name, or nil.
func (d *Driver) attachmentNamed(ctx context.Context, name string) (*attachment, error) {
	out, err := d.initiator(ctx, "list", "--json", "--run-dir", d.cfg.runDir)
	if err != nil {
		return nil, err
	}
	var all []attachment
	if err := decode(out, &all); err != nil {
		return nil, fmt.Errorf("nprdma-initiator list --json: %w", err)
	}
	for _, a := range all {
		if a.Name == name {
			return &a, nil
		}
	}
	return nil, nil
}

// attach attaches namespace nsid of nqn at addr as a loop device, named
// name, authenticating with secrets where the target requires it, and
// returns its record.
func (d *Driver) attach(ctx context.Context, name, addr, nqn string, nsid uint32, secrets stageSecrets) (*attachment, error) {
	secretArgs, remove, err := d.writeSecretFiles(name, secrets)
	if err != nil {
		return nil, fmt.Errorf("writing the DH-HMAC-CHAP secrets for nprdma-initiator: %w", err)
	}
	defer remove()
	out, err := d.initiator(ctx, append(secretArgs, "attach", "--target", addr, "--nqn", nqn, "--nsid", strconv.FormatUint(uint64(nsid), 10),
		"--mode", "fuse", "--name", name, "--daemon", "--json", "--run-dir", d.cfg.runDir)...)
	if err != nil {
		return nil, err
	}
	var a attachment
	if err := decode(bytes.TrimSpace(out), &a); err != nil {
		return nil, fmt.Errorf("nprdma-initiator attach --json: %w: %q", err, out)
	}
	if a.LoopDevice == "" {
		return nil, fmt.Errorf("nprdma-initiator attach: no loop device in %q", out)
	}
	return &a, nil
}

// detach tears the attachment name down (its final flush included).
func (d *Driver) detach(ctx context.Context, name string, force bool) error {
	args := []string{"detach", "--run-dir", d.cfg.runDir}
	if force {
		args = append(args, "--force")
	}
	_, err := d.initiator(ctx, append(args, name)...)
	return err
}
