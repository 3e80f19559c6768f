package manage

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestDecodeRequest(t *testing.T) {
	for _, c := range []struct {
		in   string
		code int // 0: decodes
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"nvmf_get_subsystems"}`, 0},
		{`{"jsonrpc":"2.0","id":"a","method":"m","params":{"nqn":"x"}}`, 0},
		{`{"jsonrpc":"2.0","method":"m","params":null}`, 0},
		{`{"jsonrpc":"2.0","id":1,"method":"m"`, CodeParseError},
		{`not json`, CodeParseError},
		{``, CodeParseError},
		{`[{"jsonrpc":"2.0","id":1,"method":"m"}]`, CodeInvalidRequest},
		{`{"jsonrpc":"1.0","id":1,"method":"m"}`, CodeInvalidRequest},
		{`{"jsonrpc":"2.0","id":1}`, CodeInvalidRequest},
		{`{"jsonrpc":"2.0","id":{},"method":"m"}`, CodeInvalidRequest},
		{`{"jsonrpc":"2.0","id":true,"method":"m"}`, CodeInvalidRequest},
		{`{"jsonrpc":"2.0","id":1,"method":"m","params":[1]}`, CodeInvalidRequest},
		{`{"jsonrpc":"2.0","id":1,"method":"m","extra":1}`, CodeInvalidRequest},
		{`{"jsonrpc":"2.0","id":1,"method":7}`, CodeInvalidRequest},
	} {
		_, err := DecodeRequest([]byte(c.in))
		switch {
		case c.code == 0 && err != nil:
			t.Errorf("%s: %v", c.in, err)
		case c.code != 0 && (err == nil || err.Code != c.code):
			t.Errorf("%s: %v, want code %d", c.in, err, c.code)
		}
	}
}

func TestDecodeParamsIsStrict(t *testing.T) {
	var p AddNamespaceParams
	if err := DecodeParams(json.RawMessage(`{"nqn":"n","size_bytes":4096}`), &p); err != nil || p.SizeBytes != 4096 {
		t.Fatalf("%+v %v", p, err)
	}
	for _, in := range []string{`{"nqn":"n","size":4096}`, `{"nqn":"n","size_bytes":"4GiB"}`, `{"nqn":"n"} {}`, `{"nsid":-1}`} {
		if err := DecodeParams(json.RawMessage(in), &p); err == nil || err.Code != CodeInvalidParams {
			t.Errorf("%s: %v, want invalid params", in, err)
		}
	}
}

// TestHostParamsKeyFiles: add-host's key files travel under their JSON
// names, and a request without them leaves them out.
func TestHostParamsKeyFiles(t *testing.T) {
	p := HostParams{NQN: "n", Host: "h", DHCHAPKeyFile: "/k/host.key", DHCHAPCtrlKeyFile: "/k/ctrl.key"}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"nqn":"n","host":"h","dhchap_key_file":"/k/host.key","dhchap_ctrl_key_file":"/k/ctrl.key"}`
	if string(b) != want {
		t.Fatalf("%s, want %s", b, want)
	}
	var back HostParams
	if err := DecodeParams(b, &back); err != nil || back != p {
		t.Fatalf("decoded %+v %v, want %+v", back, err, p)
	}
	if b, _ := json.Marshal(HostParams{NQN: "n", Host: "h"}); string(b) != `{"nqn":"n","host":"h"}` {
		t.Fatalf("without key files: %s", b)
	}
}

func TestErrorKindsTravel(t *testing.T) {
	for _, k := range kinds {
		e := ErrorFor(errors.Join(errors.New("context"), k.err))
		b, _ := json.Marshal(e)
		var back Error
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(&back, k.err) || back.Data == nil || back.Data.Kind != k.name {
			t.Errorf("%v: travelled as %s", k.err, b)
		}
		for _, other := range kinds {
			if other.err != k.err && errors.Is(&back, other.err) {
				t.Errorf("%v also matches %v", k.err, other.err)
			}
		}
	}
	if e := ErrorFor(errors.New("x")); e.Code != CodeInternal {
		t.Errorf("an error of no kind: code %d", e.Code)
	}
}

// FuzzDecodeRequest: the request decoder of the management server, on
// anything a client may send. A request it accepts survives a round trip.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"nvmf_get_subsystems"}`,
		`{"jsonrpc":"2.0","id":"x","method":"nvmf_subsystem_add_ns","params":{"nqn":"nqn.2026-01.io.nprdma:a","name":"v","size_bytes":1048576}}`,
		`{"jsonrpc":"2.0","id":null,"method":"nvmf_subsystem_remove_ns","params":{"nqn":"n","nsid":1,"force":true}}`,
		`[{"jsonrpc":"2.0"}]`,
		`{"jsonrpc":"2.0","id":1,"method":"m","params":[1,2]}`,
		`{"jsonrpc":"2.0","id":-1e9,"method":"\u0000"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := DecodeRequest(b)
		if err != nil {
			if err.Code != CodeParseError && err.Code != CodeInvalidRequest {
				t.Fatalf("code %d", err.Code)
			}
			return
		}
		out, merr := json.Marshal(req)
		if merr != nil {
			t.Fatalf("marshal of a decoded request: %v", merr)
		}
		back, err := DecodeRequest(out)
		if err != nil || back.Method != req.Method || string(back.ID) != string(req.ID) {
			t.Fatalf("round trip of %q: %+v (%v)", b, back, err)
		}
		var p AddNamespaceParams
		DecodeParams(req.Params, &p)
	})
}
