package target_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nprdma/nprdma/target"
	"github.com/nprdma/nprdma/target/manage"
)

// serveManage serves tg's management API on ln until the test ends.
func serveManage(t testing.TB, tg *target.Target, ln net.Listener, token string) {
	t.Helper()
	srv := &http.Server{Handler: tg.ManageHandler(token)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// TestManageAPIOverTheUnixSocket drives every method through a client on a
// unix socket, as nprdma-target ctl does.
func TestManageAPIOverTheUnixSocket(t *testing.T) {
	r := newManageRig(t)
	sock := filepath.Join(t.TempDir(), "manage.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	serveManage(t, r.tg, ln, "")
	c, err := manage.Dial("unix:"+sock, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	const nqn = "nqn.2026-11.io.nprdma:api"
	s, err := c.CreateSubsystem(ctx, manage.CreateSubsystemParams{NQN: nqn, Hosts: []string{hostNQN}})
	if err != nil || s.NQN != nqn || !s.Managed || len(s.Hosts) != 1 || s.Serial == "" {
		t.Fatalf("create subsystem: %+v %v", s, err)
	}
	if err := c.AddHost(ctx, manage.HostParams{NQN: nqn, Host: "nqn.2026-11.io.nprdma:second"}); err != nil {
		t.Fatal(err)
	}
	n, err := c.AddNamespace(ctx, manage.AddNamespaceParams{NQN: nqn, Name: "vol", SizeBytes: 2 << 20})
	if err != nil || n.NSID != 1 || n.SizeBytes != 2<<20 || n.Subsystem != nqn || !n.OwnsBacking || n.BudgetBytes != 512<<10 {
		t.Fatalf("add namespace: %+v %v", n, err)
	}
	if n, err = c.ResizeNamespace(ctx, manage.ResizeNamespaceParams{NQN: nqn, NSID: 1, SizeBytes: 4 << 20}); err != nil || n.SizeBytes != 4<<20 {
		t.Fatalf("resize: %+v %v", n, err)
	}
	inv, err := c.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if inv.MemoryBytes != 64<<20 || inv.MemoryBudgetedBytes != 1<<20+512<<10 || inv.ProvisionedBytes != 8<<20+4<<20 ||
		inv.CapacityBytes <= 0 || inv.AvailableBytes <= 0 || len(inv.Subsystems) != 2 || inv.VolumeDir != r.volDir {
		t.Fatalf("inventory %+v", inv)
	}
	if err := c.RemoveNamespace(ctx, manage.RemoveNamespaceParams{NQN: nqn, NSID: 1}); err != nil {
		t.Fatal(err)
	}
	err = c.RemoveHost(ctx, manage.HostParams{NQN: nqn, Host: "nqn.2026-11.io.nprdma:stranger"})
	if !errors.Is(err, manage.ErrNotFound) || !errors.Is(err, target.ErrNotFound) {
		t.Fatalf("remove an unknown host: %v, want not found", err)
	}
	if err := c.RemoveHost(ctx, manage.HostParams{NQN: nqn, Host: hostNQN}); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSubsystem(ctx, manage.DeleteSubsystemParams{NQN: nqn}); err != nil {
		t.Fatal(err)
	}
	if inv, err = c.Inventory(ctx); err != nil || len(inv.Subsystems) != 1 {
		t.Fatalf("inventory after the deletes: %+v %v", inv, err)
	}
}

// TestManageAPIBadRequests: malformed JSON, an unknown method, unknown or
// mistyped params and refused requests each get their JSON-RPC error and
// change nothing.
func TestManageAPIBadRequests(t *testing.T) {
	r := newManageRig(t)
	if _, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: subNQN, Name: "taken", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "manage.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	serveManage(t, r.tg, ln, "")
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	want := stable(t, r.tg)
	for _, c := range []struct {
		body string
		code int
		says string
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"nvmf_subsystem_add_ns","params":{"nqn":`, manage.CodeParseError, "not valid JSON"},
		{`[{"jsonrpc":"2.0","id":1,"method":"nvmf_get_subsystems"}]`, manage.CodeInvalidRequest, "batches"},
		{`{"jsonrpc":"2.0","id":1,"method":"nvmf_format"}`, manage.CodeMethodNotFound, "nvmf_subsystem_add_ns"},
		{`{"jsonrpc":"2.0","id":1,"method":"nvmf_subsystem_add_ns","params":{"nqn":"` + subNQN + `","name":"x","size":1048576}}`, manage.CodeInvalidParams, `unknown field`},
		{`{"jsonrpc":"2.0","id":1,"method":"nvmf_subsystem_add_ns","params":{"nqn":"` + subNQN + `","name":"x","size_bytes":"1GiB"}}`, manage.CodeInvalidParams, "size_bytes"},
		{`{"jsonrpc":"2.0","id":1,"method":"nvmf_subsystem_add_ns","params":{"nqn":"` + subNQN + `","name":"taken","size_bytes":1048576}}`, -17, "name is taken"},
		{`{"jsonrpc":"2.0","id":1,"method":"nvmf_subsystem_remove_host","params":{"nqn":"` + subNQN + `","host":"nqn.2026-11.io.nprdma:nobody"}}`, -2, "allow-list"},
		{`{"jsonrpc":"2.0","id":1,"method":"nvmf_subsystem_remove_host","params":{"nqn":"` + subNQN + `","host":"` + hostNQN + `","dhchap_key_file":"/k"}}`, manage.CodeInvalidParams, "nvmf_subsystem_add_host only"},
		{`{"jsonrpc":"2.0","id":1,"method":"nvmf_subsystem_remove_host","params":{"nqn":"` + subNQN + `","host":"` + hostNQN + `","dhchap_ctrl_key_file":"/k"}}`, manage.CodeInvalidParams, "nvmf_subsystem_add_host only"},
		{`{"jsonrpc":"2.0","id":1,"method":"nvmf_subsystem_add_host","params":{"nqn":"` + subNQN + `","host":"nqn.2026-11.io.nprdma:keyed","dhchap_ctrl_key_file":"/k"}}`, -22, "needs the host's key file"},
	} {
		resp, err := hc.Post("http://unix/rpc", "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"code":`+itoa(c.code)) || !strings.Contains(string(b), c.says) {
			t.Errorf("%s: HTTP %d %s, want code %d saying %q", c.body, resp.StatusCode, b, c.code, c.says)
		}
		if got := stable(t, r.tg); got != want {
			t.Fatalf("%s changed the inventory", c.body)
		}
	}
	resp, err := hc.Get("http://unix/rpc")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: HTTP %d", resp.StatusCode)
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// TestManageAPIOverTCPWantsTheToken: a client without the token, or with
// another, is refused with HTTP 401 before its request is read, and changes
// nothing; with the token it is served. A token file others may read is
// refused.
func TestManageAPIOverTCPWantsTheToken(t *testing.T) {
	r := newManageRig(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const token = "0123456789abcdef-a-good-token"
	serveManage(t, r.tg, ln, token)
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content+"\n"), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	good := write("good", token, 0o600)
	wrong := write("wrong", "0123456789abcdef-another-token", 0o600)
	open := write("open", token, 0o644)
	short := write("short", "abc", 0o600)
	ctx := context.Background()
	want := stable(t, r.tg)
	params := manage.CreateSubsystemParams{NQN: "nqn.2026-11.io.nprdma:intruder"}

	anon, err := manage.Dial(ln.Addr().String(), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anon.CreateSubsystem(ctx, params); !errors.Is(err, manage.ErrUnauthorized) {
		t.Fatalf("without a token: %v, want unauthorized", err)
	}
	if _, err := anon.Inventory(ctx); !errors.Is(err, manage.ErrUnauthorized) {
		t.Fatalf("inventory without a token: %v, want unauthorized", err)
	}
	other, err := manage.Dial(ln.Addr().String(), wrong)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.CreateSubsystem(ctx, params); !errors.Is(err, manage.ErrUnauthorized) {
		t.Fatalf("with another token: %v, want unauthorized", err)
	}
	if got := stable(t, r.tg); got != want {
		t.Fatal("refused clients changed the inventory")
	}
	if _, err := manage.Dial(ln.Addr().String(), open); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a token file others may read: %v", err)
	}
	if _, err := manage.Dial(ln.Addr().String(), short); err == nil || !strings.Contains(err.Error(), "at least 16") {
		t.Fatalf("a short token: %v", err)
	}
	c, err := manage.Dial("tcp://"+ln.Addr().String(), good)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSubsystem(ctx, params); err != nil {
		t.Fatalf("with the token: %v", err)
	}
	if r.tg.Subsystem(params.NQN) == nil {
		t.Fatal("the subsystem created with the token is not there")
	}
}
