package dhchap

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

// Known answers computed by testdata/kat.py (Python's hashlib, hmac, zlib
// and integers: an implementation independent of this package's, following
// the computations of Linux's drivers/nvme/common/auth.c and host/auth.c)
// with `python3 testdata/kat.py < testdata/ffdhe2048.hex`, recorded here.
var kat = map[string]string{
	"secret1":     "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
	"ctrlsecret1": "DHHC-1:01:Hx4dHBsaGRgXFhUUExIREA8ODQwLCgkIBwYFBAMCAQBy77Ca:",
	"kh1":         "2c9ab1af3ec2585b7d396832c2887372a090e1e2dd09565b60c80b5ac622cac2",
	"kc1":         "52de757a034f82565ee984e28a6d38291122e6986d98f7777397848b90a0571e",
	"r1_1":        "d4aa1d2244410d180ce8b3d66dfbdbcab81fbc24a9172bb1499bb255504f8690",
	"r2_1":        "c1b5aba961f747efa159d8b67de65d83407296e7cfc67387efca4cef873bb0f4",
	"secret2":     "DHHC-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:",
	"ctrlsecret2": "DHHC-1:02:Ly4tLCsqKSgnJiUkIyIhIB8eHRwbGhkYFxYVFBMSERAPDg0MCwoJCAcGBQQDAgEAG9VAFA==:",
	"kh2":         "9962e8ff8128245e8e5fd070e03726bcfc4c9c8195bb8a0b9b03414fc45a7384f1ceac0f472c3dc8ce1062d3f96efe01",
	"kc2":         "0f9061f643ad628f6ca6f5903ac4c5c0a90f0e32bb33308c01e43094ba5e7a930f4e8cbdd9518d7d666afeefe549c8ad",
	"r1_2":        "afad467338e3d67bf53e2cd1b08805d909e8ac6cc29998c8de68d7b43c6e34e3414d65d8af551453ba2ffc65a7212181",
	"r2_2":        "03db06e45b964751a89bcb7f3c8177786b2ba1f5c32e87a173577711b154fddfa5cbba8432d2b8996ef20bfa73f5a07a",
	"secret3":     "DHHC-1:03:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P4zODhA=:",
	"ctrlsecret3": "DHHC-1:03:Pz49PDs6OTg3NjU0MzIxMC8uLSwrKikoJyYlJCMiISAfHh0cGxoZGBcWFRQTEhEQDw4NDAsKCQgHBgUEAwIBALUzYbU=:",
	"kh3":         "ac32b90a25044b0a80adec574a97b0cc48aebc87b541c0609f52ad1cadf0f9992959874fef1e2b26c9d378dc81c8c9bc7ad4e7e515e9fa825af6242e9eebf03b",
	"kc3":         "b353cb36aba348fbff5cee4bc422c9986c9d32e32fc339f530fa47c57b4d7321e3c1d11edc482a63a3226f6456bcb37635283431933dc2c7525abfab84d16230",
	"r1_3":        "bec1876b111cab5ce4e908ea361af5c020403dce4de397f02c93a0c0f11f66d91bd90456a871325bd6d34d8a0682d539d97063edb44811a3df86c5786e075c72",
	"r2_3":        "b6a89fcff45710ff8fd0442bf463ecdf988fd8d89f7c7874812b2ba90a07150009768fda1d4692a534084767f628854f553d15ac4cc2c5e9ed5e9c7295d7e98f",
	"x1":          "0123456789abcdef23456789abcdef23456789abcdef23456789abcdef",
	"x2":          "01edcba987654321edcba987654321edcba987654321edcba987654321",
	"y1":          "be224c7693ec258c9865dac820c8098ec569d97bf5f957ec52ad00ea52775ff3a9c7fe4bfe96356a4254d94f10e1d175cee3412cbc78df6a16bb310f74aa701e2207ba8fb32866e937a9b556f50c894afce112a51aa7144a605dfe459f2c1453514c5f0246dc1fc8170681618f1bfdc445c14e17c9a805a7c8a134cf79175690b07db13ea7910170a875880b3387c1e4d7dc98493bff0ecf7b72d3e6f34dae599ac6151caf360a7c833e8e13d4f03829814741e8ffc6ada38253bbaf763f3db025d730d39cb98cdbde16e854d6c7d834615a96bdd1f2eda7a11dedbe97157c957574859bc334b04344dea009b4129bfc620cec4fc546bf53b5b21919fd6a12de",
	"y2":          "a415a58a5e5fd83cf72fe2f899e192a2b20784beaab97d1f98ec71a44ecd14694c92eb75b61c6e905b64ada0047e6b94982881ea96392d03fe72028b24cdefa24f04e4d450e78471c958e7c00f3632016b4fef6a0c65f6cee1ddce8d47f815eaefbf1f88b21fa90f8184d845c5235ed0ec2f83a24cfd6da58b227ab5475265135b81a98b2e48e3c935d83ed28261bfa3f15d55fa4cd8f389842fd9de4c6d4b80d73bbbe1487bf30aa1980a9266701eac8509c03b4e0f5b3a56ad5913ea057bb2bbdd1b08c82a87bf800db39bf8c18d9fb050984efb8093b08feb4a2f4aab6c9cbaffe436b938cb1f3b0dd4d5bd2559716c0a42e11bf8452483688f4d03a76cd6",
	"session":     "73fe656f4c0da99d35a35d287b96a99d0491472bd468546edde24aa4c05b89ce1604402ea667eb65b9adce2fdb54f5fe9e449942e928e62a0ef6a4188f12e9912c2fc78f890fa87ccd977d942790f61ea4852032b5f07571756d257eab7e6038d21845b3fcb04ef77591e158f87f1c4e00ad5055da774d987922784008eef55f6d35d2e8ea0a0f034a52e38842eea5b41fe5f62923d4d04b7b72a2b31a06bbedae1a7bad6c872b84996e2d1d643cea4875e6f86b6b0f27dcc334dd0a958a616cec1bbeed2138928f497e7287b59782e989c4a37440706120786673687c4ec721fae312deb2748f9134051a3900d8ed6f3dff443df707c6fd58ae2e5fcc846939",
	"aug1":        "6262dc49dd12322df28014e952f499f0a324cb5d54f5d190decc595640158697",
	"r1dh":        "5dc050a7fc04b84dab6266b4a8206256c87ca591f09248076e472312c593ce5d",
}

const (
	katHost = "nqn.2014-08.org.nvmexpress:uuid:6a7b3c1e-0d4f-4e8a-9b2c-5f1e0a9d8c7b"
	katSub  = "nqn.2024-01.io.nprdma:kat"
)

func katBytes(t *testing.T, name string) []byte {
	t.Helper()
	b, err := hex.DecodeString(kat[name])
	if err != nil || len(b) == 0 {
		t.Fatalf("vector %s: %v", name, err)
	}
	return b
}

func seqBytes(start byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = start + byte(i)
	}
	return b
}

func reversed(b []byte) []byte {
	r := bytes.Clone(b)
	for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
		r[i], r[j] = r[j], r[i]
	}
	return r
}

// TestKnownAnswers checks the secret's textual form, the transformation
// and both responses for SHA-256, SHA-384 and SHA-512 against the vectors.
func TestKnownAnswers(t *testing.T) {
	for _, h := range []HashID{HashSHA256, HashSHA384, HashSHA512} {
		t.Run(h.String(), func(t *testing.T) {
			n := string('0' + byte(h))
			key := seqBytes(0, h.Size())
			s, err := NewSecret(key, h)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.Encode(); got != kat["secret"+n] {
				t.Fatalf("textual form %s, want %s", got, kat["secret"+n])
			}
			parsed, err := ParseSecret(kat["secret"+n] + "\n")
			if err != nil || !parsed.Equal(s) {
				t.Fatalf("parse of the vector: %v", err)
			}
			ctrl, err := ParseSecret(kat["ctrlsecret"+n])
			if err != nil {
				t.Fatal(err)
			}
			if want, _ := NewSecret(reversed(key), h); !ctrl.Equal(want) {
				t.Fatal("controller secret vector decodes to another key")
			}
			kh, kc := s.Transform(katHost), ctrl.Transform(katSub)
			if !bytes.Equal(kh, katBytes(t, "kh"+n)) || !bytes.Equal(kc, katBytes(t, "kc"+n)) {
				t.Fatalf("transformed keys %x, %x", kh, kc)
			}
			r1 := HostResponse(kh, ResponseParams{Hash: h, Challenge: seqBytes(0x40, h.Size()), Seq: 0x01020304, TID: 7, HostNQN: katHost, SubNQN: katSub})
			if !bytes.Equal(r1, katBytes(t, "r1_"+n)) {
				t.Fatalf("R1 %x", r1)
			}
			r2 := ControllerResponse(kc, ResponseParams{Hash: h, Challenge: seqBytes(0xa0, h.Size()), Seq: 0x0a0b0c0d, TID: 7, HostNQN: katHost, SubNQN: katSub})
			if !bytes.Equal(r2, katBytes(t, "r2_"+n)) {
				t.Fatalf("R2 %x", r2)
			}
		})
	}
}

// TestKnownAnswersDH checks ffdhe2048 with fixed exponents: both public
// values, the session key both sides derive, the augmented challenge and a
// response over it.
func TestKnownAnswersDH(t *testing.T) {
	g := groups[DHGroupFFDHE2048]
	g.init()
	k1 := newDHKey(DHGroupFFDHE2048, g, katBytes(t, "x1"))
	k2 := newDHKey(DHGroupFFDHE2048, g, katBytes(t, "x2"))
	if !bytes.Equal(k1.PublicValue(), katBytes(t, "y1")) || !bytes.Equal(k2.PublicValue(), katBytes(t, "y2")) {
		t.Fatal("public values differ from the vectors")
	}
	s1, err := k1.SessionKey(k2.PublicValue())
	if err != nil {
		t.Fatal(err)
	}
	s2, err := k2.SessionKey(k1.PublicValue())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(s1, katBytes(t, "session")) || !bytes.Equal(s2, s1) {
		t.Fatalf("session keys %x / %x", s1[:8], s2[:8])
	}
	aug := AugmentedChallenge(HashSHA256, s1, seqBytes(0x40, 32))
	if !bytes.Equal(aug, katBytes(t, "aug1")) {
		t.Fatalf("augmented challenge %x", aug)
	}
	s, _ := NewSecret(seqBytes(0, 32), HashSHA256)
	r1 := HostResponse(s.Transform(katHost), ResponseParams{Hash: HashSHA256, Challenge: aug, Seq: 0x01020304, TID: 7, HostNQN: katHost, SubNQN: katSub})
	if !bytes.Equal(r1, katBytes(t, "r1dh")) {
		t.Fatalf("R1 over the augmented challenge %x", r1)
	}
}

// TestGroupPrimes checks each prime against the structure RFC 7919 gives
// it (2^b - 2^(b-64) + ... - 1: the top and bottom 64 bits set, b bits)
// and against the SHA-256 of the prime OpenSSL 3.0.19 prints for the named
// group (`openssl genpkey -algorithm DH -pkeyopt group:ffdheN` then
// `openssl asn1parse`); ffdhe2048 is also compared with the copy kat.py
// reads.
func TestGroupPrimes(t *testing.T) {
	sums := map[DHGroupID]string{
		DHGroupFFDHE2048: "9cd3b7f336872f46c09428d1bbc19877a4d440512cda8d1c1cf0cd6e33698966",
		DHGroupFFDHE3072: "0eaf67db3a839156d5013494a5318a772b5697d270d721f37f092efc69ea5a17",
		DHGroupFFDHE4096: "4648414224ac881b3d0dc59b466f96d06a558278776807797ecf1f66ff397b3e",
		DHGroupFFDHE6144: "227ac9066b3ddd9e193670cda2388fa884f65ba0cf98b742d1fe77a6687c79c7",
		DHGroupFFDHE8192: "770b14efaf6f049929c523113b3fa99a8d11dab1b18af3609590122075d19833",
	}
	for id, sum := range sums {
		p, err := hex.DecodeString(groups[id].prime)
		if err != nil {
			t.Fatal(err)
		}
		if len(p) != id.Size() || len(p)*8 != []int{0, 2048, 3072, 4096, 6144, 8192}[id] {
			t.Fatalf("%v: %d bytes", id, len(p))
		}
		ones := bytes.Repeat([]byte{0xff}, 8)
		if !bytes.Equal(p[:8], ones) || !bytes.Equal(p[len(p)-8:], ones) {
			t.Fatalf("%v: top or bottom 64 bits not all set", id)
		}
		if got := hex.EncodeToString(HashSHA256.digest(p)); got != sum {
			t.Fatalf("%v: SHA-256 %s, want %s", id, got, sum)
		}
	}
	if !strings.EqualFold(strings.TrimSpace(readFile(t, "testdata/ffdhe2048.hex")), groups[DHGroupFFDHE2048].prime) {
		t.Fatal("testdata/ffdhe2048.hex is not the ffdhe2048 prime")
	}
}
