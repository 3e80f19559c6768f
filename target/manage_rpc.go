package target

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/nprdma/nprdma/target/manage"
)

// ManageHandler serves the management API (package manage): one JSON-RPC
// 2.0 request per POST to /rpc. With a token, every request must carry it
// ("Authorization: Bearer TOKEN", compared in constant time) or gets HTTP
// 401 and nothing else; without one (a unix socket, guarded by its file
// mode) none is asked. Bodies beyond manage.MaxRequestBytes are refused.
func (t *Target) ManageHandler(token string) http.Handler {
	var want [sha256.Size]byte
	if token != "" {
		want = sha256.Sum256([]byte(token))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token != "" {
			got, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			sum := sha256.Sum256([]byte(got))
			// Hashes of equal length: the comparison's time says nothing
			// about the token's length or its prefix.
			if subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
				t.log.Warn("target: management request refused: no valid token", "from", r.RemoteAddr)
				writeRPC(w, http.StatusUnauthorized, nil, nil, manage.ErrorFor(fmt.Errorf("%w: this endpoint wants \"Authorization: Bearer TOKEN\" with the target's token", manage.ErrUnauthorized)))
				return
			}
		}
		if r.URL.Path != "/rpc" {
			http.Error(w, "the management API answers POST /rpc", http.StatusNotFound)
			return
		}
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "the management API answers POST /rpc", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, manage.MaxRequestBytes))
		if err != nil {
			writeRPC(w, http.StatusRequestEntityTooLarge, nil, nil, manage.Errorf(manage.CodeInvalidRequest, "invalid request: %v", err))
			return
		}
		req, rerr := manage.DecodeRequest(body)
		if rerr != nil {
			writeRPC(w, http.StatusOK, req.ID, nil, rerr)
			return
		}
		res, err := t.manageCall(req)
		if err != nil {
			var e *manage.Error
			if !errors.As(err, &e) {
				e = manage.ErrorFor(err)
			}
			writeRPC(w, http.StatusOK, req.ID, nil, e)
			return
		}
		writeRPC(w, http.StatusOK, req.ID, res, nil)
	})
}

func writeRPC(w http.ResponseWriter, status int, id json.RawMessage, result any, e *manage.Error) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	resp := manage.Response{JSONRPC: "2.0", ID: id, Error: e}
	if e == nil {
		b, err := json.Marshal(result)
		if err != nil {
			resp.Error = manage.ErrorFor(err)
		} else {
			resp.Result = b
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(resp)
}

// manageCall runs one method.
func (t *Target) manageCall(req manage.Request) (any, error) {
	decode := func(v any) error {
		if e := manage.DecodeParams(req.Params, v); e != nil {
			return e
		}
		return nil
	}
	switch req.Method {
	case manage.MethodGetSubsystems:
		var p struct{}
		if err := decode(&p); err != nil {
			return nil, err
		}
		return t.Inventory()
	case manage.MethodCreateSubsystem:
		var p manage.CreateSubsystemParams
		if err := decode(&p); err != nil {
			return nil, err
		}
		s, err := t.CreateSubsystem(SubsystemConfig{NQN: p.NQN, AllowHosts: p.Hosts, AllowAnyHost: p.AllowAnyHost})
		if err != nil {
			return nil, err
		}
		return t.subsystemInfo(s)
	case manage.MethodDeleteSubsystem:
		var p manage.DeleteSubsystemParams
		if err := decode(&p); err != nil {
			return nil, err
		}
		return true, t.DeleteSubsystem(p.NQN, p.Force)
	case manage.MethodAddHost:
		var p manage.HostParams
		if err := decode(&p); err != nil {
			return nil, err
		}
		return true, t.AddHost(p.NQN, HostConfig{NQN: p.Host, DHCHAPKeyFile: p.DHCHAPKeyFile, DHCHAPCtrlKeyFile: p.DHCHAPCtrlKeyFile})
	case manage.MethodRemoveHost:
		var p manage.HostParams
		if err := decode(&p); err != nil {
			return nil, err
		}
		if p.DHCHAPKeyFile != "" || p.DHCHAPCtrlKeyFile != "" {
			return nil, manage.Errorf(manage.CodeInvalidParams, "invalid params: dhchap_key_file and dhchap_ctrl_key_file are for %s only", manage.MethodAddHost)
		}
		return true, t.RemoveHost(p.NQN, p.Host)
	case manage.MethodAddNamespace:
		var p manage.AddNamespaceParams
		if err := decode(&p); err != nil {
			return nil, err
		}
		n, err := t.CreateNamespace(NamespaceRequest{Subsystem: p.NQN, Name: p.Name, NSID: p.NSID, Size: p.SizeBytes,
			Backing: p.Backing, Budget: p.BudgetBytes, MaxSize: p.MaxSizeBytes})
		if err != nil {
			return nil, err
		}
		return n.info(), nil
	case manage.MethodResizeNamespace:
		var p manage.ResizeNamespaceParams
		if err := decode(&p); err != nil {
			return nil, err
		}
		n, err := t.ResizeNamespace(p.NQN, p.NSID, p.SizeBytes)
		if err != nil {
			return nil, err
		}
		return n.info(), nil
	case manage.MethodRemoveNamespace:
		var p manage.RemoveNamespaceParams
		if err := decode(&p); err != nil {
			return nil, err
		}
		return true, t.DeleteNamespace(p.NQN, p.NSID, p.Force)
	}
	return nil, manage.Errorf(manage.CodeMethodNotFound, "method %q not found (the methods: %s)", req.Method, strings.Join(manageMethods, ", "))
}

var manageMethods = []string{manage.MethodGetSubsystems, manage.MethodCreateSubsystem, manage.MethodDeleteSubsystem,
	manage.MethodAddHost, manage.MethodRemoveHost, manage.MethodAddNamespace, manage.MethodResizeNamespace,
	manage.MethodRemoveNamespace}

// subsystemInfo is s as the inventory shows it.
func (t *Target) subsystemInfo(s *Subsystem) (manage.SubsystemInfo, error) {
	inv, err := t.Inventory()
	if err != nil {
		return manage.SubsystemInfo{}, err
	}
	for _, si := range inv.Subsystems {
		if si.NQN == s.nqn {
			return si, nil
		}
	}
	return manage.SubsystemInfo{}, fmt.Errorf("target: subsystem %s %w", s.nqn, ErrNotFound)
}
