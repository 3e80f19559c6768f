package nvme

import (
	"errors"
	"testing"
)

func TestAuthCommands(t *testing.T) {
	send := AuthSendCommand(72, InCapsuleSGL(0, 72))
	b := send.Marshal()
	if b[4] != byte(FabricsAuthSend) || b[41] != 1 || b[42] != 1 || b[43] != 0xe9 || le.Uint32(b[44:]) != 72 {
		t.Fatalf("auth send bytes % x", b[40:48])
	}
	if send.Direction() != HostToController || send.Name(true) != "fabrics-auth-send" {
		t.Fatalf("auth send: %v %s", send.Direction(), send.Name(true))
	}
	recv := AuthReceiveCommand(4096, must(KeyedSGL(0x1000, 4096, 3)))
	if recv.Direction() != ControllerToHost {
		t.Fatalf("auth receive direction %v", recv.Direction())
	}
	var back Command
	if err := back.Unmarshal(recv.Marshal()); err != nil {
		t.Fatal(err)
	}
	if p, err := back.CheckAuth(8192); err != nil || p != (AuthParams{SECP: 0xe9, SPSP0: 1, SPSP1: 1, Length: 4096}) {
		t.Fatalf("auth receive: %+v %v", p, err)
	}
	for name, tc := range map[string]struct {
		cmd  Command
		want Status
	}{
		"secp":       {func() Command { c := send; c.CDW10 &^= 0xff << 24; return c }(), StatusInvalidField},
		"spsp":       {func() Command { c := send; c.CDW10 ^= 3 << 8; return c }(), StatusInvalidField},
		"zero":       {AuthSendCommand(0, InCapsuleSGL(0, 0)), StatusInvalidField},
		"too long":   {AuthSendCommand(9000, InCapsuleSGL(0, 9000)), StatusInvalidField},
		"sgl length": {AuthSendCommand(72, InCapsuleSGL(0, 64)), StatusDataSGLLengthInvalid},
	} {
		_, err := tc.cmd.CheckAuth(8192)
		if !errors.Is(err, tc.want) || !StatusOf(err).DNR() {
			t.Errorf("%s: %v, want %v with DNR", name, err, tc.want)
		}
	}
}
