package csi

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/nprdma/nprdma/internal/fiotest"
	"github.com/nprdma/nprdma/nvme/dhchap"
)

var blockCap = &csipb.VolumeCapability{
	AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
	AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// TestStageAuthenticates: a volume of a StorageClass with key files makes
// the target require DH-HMAC-CHAP, both ways, of the node it is published
// to. NodeStageVolume without secrets, with a wrong host secret or with a
// wrong controller secret is Unauthenticated with the initiator's message
// and leaves nothing attached; a malformed secret, or a controller secret
// alone, is InvalidArgument naming the key and not the value; with the
// right secrets the volume stages (twice: idempotent) and fio verifies on
// it. Meanwhile no secret is on the attach process's command line or in
// its environment, and none in a file once attach has returned; after
// NodeUnstageVolume none is in the plugin's log (which holds the requests,
// redacted) or in any file under the run directory. All through the
// driver's socket, as the kubelet and the sidecars call it.
func TestStageAuthenticates(t *testing.T) {
	requireNode(t)
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("fio is not installed (scripts/deps.sh installs it)")
	}
	r := newRig(t, true)
	conn, err := grpc.NewClient("unix://"+r.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c, n := csipb.NewControllerClient(conn), csipb.NewNodeClient(conn)
	ctx := context.Background()

	var host, ctrl, wrong *dhchap.Secret
	for _, s := range []struct {
		dst  **dhchap.Secret
		hash dhchap.HashID
	}{{&host, dhchap.HashSHA256}, {&ctrl, dhchap.HashSHA384}, {&wrong, dhchap.HashSHA256}} {
		if *s.dst, err = dhchap.GenerateSecret(s.hash, 0, nil); err != nil {
			t.Fatal(err)
		}
	}
	malformed := []byte(host.Encode())
	malformed[12] ^= 1 // in the base64: the CRC no longer matches
	secrets := []string{host.Encode(), ctrl.Encode(), wrong.Encode(), string(malformed)}
	keyDir := t.TempDir()
	hostFile, ctrlFile := filepath.Join(keyDir, "host.key"), filepath.Join(keyDir, "ctrl.key")
	for path, s := range map[string]*dhchap.Secret{hostFile: host, ctrlFile: ctrl} {
		if err := os.WriteFile(path, []byte(s.Encode()), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	vol, err := c.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "authenticated", VolumeCapabilities: []*csipb.VolumeCapability{blockCap},
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 16 << 20},
		Parameters:    map[string]string{paramDHCHAPKeyFile: hostFile, paramDHCHAPCtrlKeyFile: ctrlFile}})
	if err != nil {
		t.Fatal(err)
	}
	id, volCtx := vol.GetVolume().GetVolumeId(), vol.GetVolume().GetVolumeContext()
	pub, err := c.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: id, NodeId: r.hostNQN,
		VolumeCapability: blockCap, VolumeContext: volCtx})
	if err != nil {
		t.Fatal(err)
	}
	staging := filepath.Join(t.TempDir(), "staging")
	stage := func(secrets map[string]string) error {
		_, err := n.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: blockCap,
			PublishContext: pub.GetPublishContext(), VolumeContext: volCtx, Secrets: secrets})
		return err
	}

	for _, tc := range []struct {
		name    string
		secrets map[string]string
		code    codes.Code
		says    string
	}{
		{"no secret", nil, codes.Unauthenticated, "no secret was given"},
		{"a wrong host secret", map[string]string{secretDHCHAP: wrong.Encode()}, codes.Unauthenticated, "refused host " + r.hostNQN + "'s DH-HMAC-CHAP secret"},
		{"a wrong controller secret", map[string]string{secretDHCHAP: host.Encode(), secretDHCHAPCtrl: wrong.Encode()}, codes.Unauthenticated,
			"did not prove it holds the controller secret"},
		{"a malformed secret", map[string]string{secretDHCHAP: string(malformed)}, codes.InvalidArgument, "node-stage secret dhchapSecret: dhchap: malformed secret"},
		{"a controller secret alone", map[string]string{secretDHCHAPCtrl: ctrl.Encode()}, codes.InvalidArgument, "dhchapCtrlSecret needs dhchapSecret"},
	} {
		err := stage(tc.secrets)
		msg := status.Convert(err).Message()
		if status.Code(err) != tc.code || !strings.Contains(msg, tc.says) {
			t.Errorf("NodeStageVolume with %s: %v; want %v saying %q", tc.name, err, tc.code, tc.says)
		}
		checkNoSecret(t, "the error of NodeStageVolume with "+tc.name, msg, secrets)
		r.checkNothingLeft(t, "NodeStageVolume with "+tc.name)
	}

	right := map[string]string{secretDHCHAP: host.Encode(), secretDHCHAPCtrl: ctrl.Encode(), "unrelated": "ignored"}
	if err := stage(right); err != nil {
		t.Fatalf("NodeStageVolume with the right secrets: %v", err)
	}
	a, err := r.driver.attachmentNamed(ctx, volumeFor("", "authenticated").attachName())
	if err != nil || a == nil {
		t.Fatalf("attachment: %+v %v", a, err)
	}
	if err := stage(right); err != nil {
		t.Fatalf("NodeStageVolume again: %v", err)
	}
	pid := attachPID(t, r, a.Name)
	if again := attachPID(t, r, a.Name); again != pid {
		t.Fatalf("the second NodeStageVolume replaced the attachment (pid %d, then %d)", pid, again)
	}
	for _, f := range []string{"cmdline", "environ"} {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), f))
		if err != nil {
			t.Fatal(err)
		}
		checkNoSecret(t, "the attach process's "+f, string(b), secrets)
	}
	if left, _ := os.ReadDir(r.driver.secretsDir()); len(left) != 0 {
		t.Errorf("secret files left once attach returned: %v", left)
	}

	out, err := exec.Command("fio", "--name=verify", "--filename="+a.LoopDevice, "--direct=1", "--ioengine=libaio", "--rw=randwrite",
		"--bs=4k", "--iodepth=16", "--size=8m", "--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0",
		"--group_reporting", "--output-format=json").CombinedOutput()
	if err != nil {
		t.Fatalf("fio on %s: %v\n%s", a.LoopDevice, err, out)
	}
	if err := fiotest.CheckVerify(out, 8<<20); err != nil {
		t.Fatal(err)
	}

	if _, err := n.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	r.checkNothingLeft(t, "after NodeUnstageVolume")
	if _, err := c.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: r.hostNQN}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}

	log := r.log.String()
	if !strings.Contains(log, "csi: request") || !strings.Contains(log, "NodeStageVolume") || !strings.Contains(log, redactedValue) {
		t.Error("the log holds no NodeStageVolume request with its secrets redacted")
	}
	checkNoSecret(t, "the plugin's log", log, secrets)
	filepath.WalkDir(r.runDir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checkNoSecret(t, path, string(b), secrets)
		return nil
	})
}

// checkNoSecret fails the test if text (from where) holds one of the
// secrets, whole or its base64.
func checkNoSecret(t *testing.T, where, text string, secrets []string) {
	t.Helper()
	for _, s := range secrets {
		if b64 := strings.TrimSuffix(s[len("DHHC-1:hh:"):], ":"); strings.Contains(text, b64) {
			t.Errorf("%s holds a secret", where)
		}
	}
}

// attachPID is the pid of the attachment name's process.
func attachPID(t *testing.T, r *rig, name string) int {
	t.Helper()
	out, err := exec.Command(r.driver.cfg.initiator, "list", "--json", "--run-dir", r.runDir).Output()
	if err != nil {
		t.Fatal(err)
	}
	var recs []struct {
		Name string `json:"name"`
		PID  int    `json:"pid"`
	}
	if err := json.Unmarshal(out, &recs); err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		if rec.Name == name && rec.PID > 0 {
			return rec.PID
		}
	}
	t.Fatalf("no process for attachment %s in %s", name, out)
	return 0
}

// TestRedactedRequests: the log's text of a request keeps every field but
// the secrets, whose keys it keeps.
func TestRedactedRequests(t *testing.T) {
	req := &csipb.NodeStageVolumeRequest{VolumeId: "t1/0123456789abcdef0123", StagingTargetPath: "/staging",
		Secrets: map[string]string{secretDHCHAP: "DHHC-1:01:not-to-be-seen:"}, VolumeContext: map[string]string{ctxNQN: "nqn.x"}}
	got := redacted(req)
	for _, want := range []string{"t1/0123456789abcdef0123", "/staging", `"dhchapSecret"`, redactedValue, "nqn.x"} {
		if !strings.Contains(got, want) {
			t.Errorf("%s: no %s", got, want)
		}
	}
	if strings.Contains(got, "not-to-be-seen") {
		t.Errorf("%s: the secret is there", got)
	}
	if req.GetSecrets()[secretDHCHAP] != "DHHC-1:01:not-to-be-seen:" {
		t.Error("redacted changed the request itself")
	}
	if got := redacted(&csipb.CreateVolumeRequest{Name: "v", Secrets: map[string]string{"token": "hidden"}}); strings.Contains(got, "hidden") {
		t.Errorf("CreateVolume's secrets: %s", got)
	}
}

// TestKeyFileParameters: the key file parameters are absolute paths, the
// controller's only with the host's; a key file the target cannot read
// fails ControllerPublishVolume with InvalidArgument and lets no host in.
func TestKeyFileParameters(t *testing.T) {
	r := newRig(t, false)
	c := controller{d: r.driver}
	ctx := context.Background()
	for _, tc := range []struct {
		params map[string]string
		says   string
	}{
		{map[string]string{paramDHCHAPKeyFile: "host.key"}, "not an absolute path"},
		{map[string]string{paramDHCHAPCtrlKeyFile: "/etc/nprdma/ctrl.key"}, "dhchapCtrlKeyFile needs dhchapKeyFile"},
	} {
		_, err := c.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "refused", VolumeCapabilities: []*csipb.VolumeCapability{blockCap},
			CapacityRange: &csipb.CapacityRange{RequiredBytes: 1 << 20}, Parameters: tc.params})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("CreateVolume with %v: %v, want InvalidArgument saying %q", tc.params, err, tc.says)
		}
	}
	vol, err := c.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "keyed", VolumeCapabilities: []*csipb.VolumeCapability{blockCap},
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 1 << 20},
		Parameters:    map[string]string{paramDHCHAPKeyFile: filepath.Join(t.TempDir(), "missing.key")}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: vol.GetVolume().GetVolumeId()})
	const node = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001"
	_, err = c.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: vol.GetVolume().GetVolumeId(), NodeId: node,
		VolumeCapability: blockCap, VolumeContext: vol.GetVolume().GetVolumeContext()})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "missing.key") {
		t.Fatalf("ControllerPublishVolume with a key file the target cannot read: %v, want InvalidArgument naming it", err)
	}
	for _, inv := range r.inventories(t) {
		for _, s := range inv.Subsystems {
			if len(s.Hosts) != 0 {
				t.Errorf("%s lets in %v", s.NQN, s.Hosts)
			}
		}
	}
}

// TestLeftoverSecretsRemovedAtStart: secret files a node plugin that died
// during an attach left are gone once the next one starts.
func TestLeftoverSecretsRemovedAtStart(t *testing.T) {
	runDir := t.TempDir()
	left := filepath.Join(runDir, "csi-secrets", "csi-0123-42")
	if err := os.MkdirAll(left, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(left, "host"), []byte("DHHC-1:00:left-behind:\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(WithNode("nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000002", "nprdma-initiator", runDir)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(runDir, "csi-secrets")); !os.IsNotExist(err) {
		t.Fatalf("the secrets left behind are still there: %v", err)
	}
}
